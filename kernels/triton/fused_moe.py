"""The routed experts of an MoE layer in three device steps: sort-and-align, gate_up with SiLU-and-mul, down.

``moe_align`` (kernels/triton/fused_moe_operands.py) sorts the step's ``T*k`` (token, choice) pairs by expert and pads
each expert's run to blocks of ``BLOCK_M`` rows; a program takes one block, all of one expert, and the experts'
weights are read through an ``ExpertStack``'s table of per-expert addresses (same module).

``moe_gate_up_kernel`` computes, per block, ``silu(x W_gate.T) * (x W_up.T)`` for its pairs' tokens (gate and
up are the two row halves of the expert's ``[2I, H]`` weight) and writes ``[T*k, I]``; ``moe_down_kernel``
multiplies that by the expert's ``[H, I]`` down weight and applies the pair's routing weight in the epilogue,
writing ``[T*k, H]``. The k outputs of a token are then added in ascending expert id by the same torch code
as ``grouped_experts`` (``sum_in_expert_order``): no atomics, and the reference's bit-stability holds.

Formats follow host_gemm: dense bf16/fp16/fp32; int8 / fp8 codes with one scale per output channel (loaded
once per program, applied to the accumulator, so the tensor-core products are of exact small integers / fp8
values) or per group (tiles of group scales in the K loop, int8 only); int4 with group scale and minimum
loaded as ``[BLOCK_N, groups]`` tiles. Every load is upcast to float32 and ``tl.dot`` runs in TF32 on the GPU
(exact for bf16/fp16 inputs and integer codes, ~1e-3 relative for dequantized int4 tiles and fp32 inputs);
the interpreter computes in full fp32.

A row's result depends only on its own token and expert and the tile shape, never on the other rows of the
step: ``BLOCK_M`` is the only shape that changes with the batch, and callers that need batch invariance fix it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from gh200rt.kernels.triton.compile_specs import CompileSpec, signature_of
from gh200rt.kernels.triton.fused_moe_operands import BLOCK_K, FP32_BLOCK_K, ExpertStack, moe_align
from gh200rt.kernels.triton.weight_operands import FMT_DENSE, FMT_INT4, FMT_SCALED

BLOCK_N = 64
SMALL_BLOCK_M, LARGE_BLOCK_M = 16, 64   # tl.dot needs 16 rows; 64 once experts see many rows (prefill)


# ---- kernels ---------------------------------------------------------------------------------------------
@triton.jit
def _group_params(ptr, offs_n, n_ok, g0, stride_sn, n_groups, GROUP_TILE: tl.constexpr):
    """The ``[BLOCK_N, GROUP_TILE]`` tile of per-group parameters starting at group ``g0``."""
    gs = g0 + tl.arange(0, GROUP_TILE)
    return tl.load(ptr + offs_n[:, None] * stride_sn + gs[None, :], mask=n_ok[:, None] & (gs < n_groups)[None, :],
                   other=0.0)


@triton.jit
def _dequant(q, scale, minimum, HAS_MIN: tl.constexpr, GROUP_TILE: tl.constexpr, BN: tl.constexpr,
            BK: tl.constexpr):
    """``q * scale (+ minimum)`` for a ``[BN, BK]`` tile whose columns fall in GROUP_TILE equal groups."""
    if GROUP_TILE == 1:
        w = q * scale
        if HAS_MIN:
            w += minimum
        return w
    w = tl.reshape(q, (BN, GROUP_TILE, BK // GROUP_TILE)) * scale[:, :, None]
    if HAS_MIN:
        w += minimum[:, :, None]
    return tl.reshape(w, (BN, BK))


@triton.jit
def _expert_matmul(x_rows, m_ok, w_ptr, s_ptr, min_ptr, offs_n, n_ok, K, row_stride, stride_sn, group_size,
                   FMT: tl.constexpr, SCALE_ON_ACC: tl.constexpr, GROUP_TILE: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """``x[BM, K] @ W[offs_n, :].T`` in float32 for one expert's weight, dequantized in registers."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    n_groups = tl.cdiv(K, group_size)
    if FMT == 2:
        # int4 walked in bytes (byte j: columns 2j low nibble, 2j+1 high), as host_gemm does
        HALF: tl.constexpr = BLOCK_K // 2
        k_packed = (K + 1) // 2
        for b0 in range(0, k_packed, HALF):
            offs_b = b0 + tl.arange(0, HALF)
            w_mask = n_ok[:, None] & (offs_b < k_packed)[None, :]
            packed = tl.load(w_ptr + offs_n[:, None] * row_stride + offs_b[None, :], mask=w_mask, other=0)
            g0 = (2 * b0) // group_size
            scale = _group_params(s_ptr, offs_n, n_ok, g0, stride_sn, n_groups, GROUP_TILE)
            minimum = _group_params(min_ptr, offs_n, n_ok, g0, stride_sn, n_groups, GROUP_TILE)
            col = offs_b * 2
            x_even = tl.load(x_rows + col[None, :], mask=m_ok[:, None] & (col < K)[None, :], other=0.0)
            x_odd = tl.load(x_rows + col[None, :] + 1, mask=m_ok[:, None] & (col + 1 < K)[None, :], other=0.0)
            w_even = _dequant((packed & 0xF).to(tl.float32), scale, minimum, True, GROUP_TILE, BLOCK_N, HALF)
            w_odd = _dequant((packed >> 4).to(tl.float32), scale, minimum, True, GROUP_TILE, BLOCK_N, HALF)
            acc = tl.dot(x_even.to(tl.float32), tl.trans(w_even), acc)
            acc = tl.dot(x_odd.to(tl.float32), tl.trans(w_odd), acc)
    else:
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_ok = offs_k < K
            w = tl.load(w_ptr + offs_n[:, None] * row_stride + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :],
                        other=0.0).to(tl.float32)
            if FMT == 1:
                if not SCALE_ON_ACC:
                    scale = _group_params(s_ptr, offs_n, n_ok, k0 // group_size, stride_sn, n_groups, GROUP_TILE)
                    w = _dequant(w, scale, scale, False, GROUP_TILE, BLOCK_N, BLOCK_K)
            x = tl.load(x_rows + offs_k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            acc = tl.dot(x.to(tl.float32), tl.trans(w), acc)
        if SCALE_ON_ACC:
            acc *= tl.load(s_ptr + offs_n * stride_sn, mask=n_ok, other=0.0)[None, :]
    return acc


@triton.jit
def _expert_pointers(table_ptr, like_ptr, expert, num_experts):
    w_ptr = tl.load(table_ptr + expert).to(like_ptr.dtype)
    s_ptr = tl.load(table_ptr + num_experts + expert).to(tl.pointer_type(tl.float32))
    min_ptr = tl.load(table_ptr + 2 * num_experts + expert).to(tl.pointer_type(tl.float32))
    return w_ptr, s_ptr, min_ptr


@triton.jit
def _block_tile(sorted_ptr, pid_b, pid_n, num_pairs, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Aligned block ``pid_b``'s (token, choice) pairs (padding past ``num_pairs`` masked) and output column tile
    ``pid_n`` of ``N``: offsets and masks."""
    pairs = tl.load(sorted_ptr + pid_b * BLOCK_M + tl.arange(0, BLOCK_M))
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    return pairs, pairs < num_pairs, offs_n, offs_n < N


@triton.jit
def moe_gate_up_kernel(x_ptr, table_ptr, like_ptr, sorted_ptr, block_expert_ptr, act_ptr,
                       num_pairs, num_experts, I, K, row_stride, stride_sn, group_size, stride_xm, stride_am,
                       TOP_K: tl.constexpr, FMT: tl.constexpr, SCALE_ON_ACC: tl.constexpr, GROUP_TILE: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n, pid_b = tl.program_id(0), tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_b)
    if expert >= num_experts:
        return
    pairs, m_ok, offs_n, n_ok = _block_tile(sorted_ptr, pid_b, pid_n, num_pairs, I, BLOCK_M, BLOCK_N)
    x_rows = x_ptr + (pairs // TOP_K)[:, None] * stride_xm
    w_ptr, s_ptr, min_ptr = _expert_pointers(table_ptr, like_ptr, expert, num_experts)
    gate = _expert_matmul(x_rows, m_ok, w_ptr, s_ptr, min_ptr, offs_n, n_ok, K, row_stride, stride_sn, group_size,
                          FMT, SCALE_ON_ACC, GROUP_TILE, BLOCK_M, BLOCK_N, BLOCK_K)
    up = _expert_matmul(x_rows, m_ok, w_ptr, s_ptr, min_ptr, offs_n + I, n_ok, K, row_stride, stride_sn,
                        group_size, FMT, SCALE_ON_ACC, GROUP_TILE, BLOCK_M, BLOCK_N, BLOCK_K)
    # round where the torch path rounds (gate_up, silu, product), so bf16 runs differ only by the GEMMs
    dt = act_ptr.dtype.element_ty
    gate = gate.to(dt).to(tl.float32)
    silu = (gate * tl.sigmoid(gate)).to(dt).to(tl.float32)
    act = silu * up.to(dt).to(tl.float32)
    tl.store(act_ptr + pairs[:, None] * stride_am + offs_n[None, :], act.to(dt), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def moe_down_kernel(act_ptr, table_ptr, like_ptr, sorted_ptr, block_expert_ptr, topk_w_ptr, out_ptr,
                    num_pairs, num_experts, N, K, row_stride, stride_sn, group_size, stride_am, stride_om,
                    SCALE_FP32: tl.constexpr, FMT: tl.constexpr, SCALE_ON_ACC: tl.constexpr,
                    GROUP_TILE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n, pid_b = tl.program_id(0), tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_b)
    if expert >= num_experts:
        return
    pairs, m_ok, offs_n, n_ok = _block_tile(sorted_ptr, pid_b, pid_n, num_pairs, N, BLOCK_M, BLOCK_N)
    w_ptr, s_ptr, min_ptr = _expert_pointers(table_ptr, like_ptr, expert, num_experts)
    acc = _expert_matmul(act_ptr + pairs[:, None] * stride_am, m_ok, w_ptr, s_ptr, min_ptr, offs_n, n_ok, K,
                         row_stride, stride_sn, group_size, FMT, SCALE_ON_ACC, GROUP_TILE, BLOCK_M, BLOCK_N, BLOCK_K)
    # the routing weight as grouped_experts applies it: to the expert's rounded output, in float32 (Mixtral)
    # or rounded to the activations' dtype first (Qwen-MoE)
    dt = out_ptr.dtype.element_ty
    routing = tl.load(topk_w_ptr + pairs, mask=m_ok, other=0.0)
    if not SCALE_FP32:
        routing = routing.to(dt).to(tl.float32)
    y = acc.to(dt).to(tl.float32) * routing[:, None]
    tl.store(out_ptr + pairs[:, None] * stride_om + offs_n[None, :], y.to(dt), mask=m_ok[:, None] & n_ok[None, :])


# ---- wrapper and reference ---------------------------------------------------------------------------------
def block_m_for(pairs: int, num_experts: int) -> int:
    """16 rows while experts see a few tokens each (decode), 64 once they see many (prefill)."""
    return LARGE_BLOCK_M if pairs >= 4 * LARGE_BLOCK_M * num_experts else SMALL_BLOCK_M


def _launch_config(stack: ExpertStack) -> dict:
    return dict(FMT=stack.fmt, SCALE_ON_ACC=stack.scale_on_acc, GROUP_TILE=stack.group_tile,
                BLOCK_N=BLOCK_N, BLOCK_K=stack.block_k)


def fused_moe(x: torch.Tensor, topk_weights: torch.Tensor, ids: torch.Tensor, gate_up: ExpertStack,
              down: ExpertStack, scale_fp32: bool = False, block_m: int | None = None) -> torch.Tensor:
    """``grouped_experts``'s result for experts ``gate_up`` ([2I, H] each) and ``down`` ([H, I] each)."""
    from gh200rt.models.layers.moe_experts import sum_in_expert_order
    tokens, top_k = ids.shape
    num_experts = gate_up.table.shape[1]
    (two_i, hidden), inter = gate_up.shape, down.shape[1]
    assert two_i == 2 * inter and down.shape[0] == hidden == x.shape[1], (gate_up.shape, down.shape, x.shape)
    pairs = tokens * top_k
    block_m = block_m or block_m_for(pairs, num_experts)
    sorted_pairs, block_expert = moe_align(ids, num_experts, block_m)
    x = x.contiguous()
    act = x.new_empty(pairs, inter)
    blocks = block_expert.numel()
    moe_gate_up_kernel[(triton.cdiv(inter, BLOCK_N), blocks)](
        x, gate_up.table, gate_up.like, sorted_pairs, block_expert, act,
        pairs, num_experts, inter, hidden, gate_up.row_stride, gate_up.scale_stride, gate_up.group_size,
        x.stride(0), act.stride(0), TOP_K=top_k, BLOCK_M=block_m, **_launch_config(gate_up))
    out = x.new_empty(pairs, hidden)
    moe_down_kernel[(triton.cdiv(hidden, BLOCK_N), blocks)](
        act, down.table, down.like, sorted_pairs, block_expert, topk_weights.float().contiguous(), out,
        pairs, num_experts, hidden, inter, down.row_stride, down.scale_stride, down.group_size,
        act.stride(0), out.stride(0), SCALE_FP32=scale_fp32, BLOCK_M=block_m, **_launch_config(down))
    return sum_in_expert_order(out.view(tokens, top_k, hidden), ids)


def reference_fused_moe(x: torch.Tensor, topk_weights: torch.Tensor, ids: torch.Tensor, gate_up: list, down: list,
                        scale_fp32: bool = False) -> torch.Tensor:
    """``grouped_experts`` with each expert's linears as host_gemm's float32 reference, rounded to x's dtype."""
    from gh200rt.models.layers.activation import silu_and_mul
    from gh200rt.models.layers.moe_experts import grouped_experts

    def linear(rows: torch.Tensor, w) -> torch.Tensor:
        dense = w.dequantize() if hasattr(w, "dequantize") else w.float()
        return torch.nn.functional.linear(rows.float(), dense.to(rows.device)).to(x.dtype)

    def expert(e: int, rows: torch.Tensor) -> torch.Tensor:
        return linear(silu_and_mul(linear(rows, gate_up[e])), down[e])
    return grouped_experts(x, topk_weights, ids, len(gate_up), expert, scale_fp32)


def compile_specs():
    """Hopper compile checks: each host format, both kernels, the decode tile (16 rows)."""
    aligned = ("x_ptr", "act_ptr", "out_ptr", "table_ptr", "like_ptr", "sorted_ptr", "block_expert_ptr",
               "topk_w_ptr", "I", "N", "K", "row_stride", "stride_xm", "stride_am", "stride_om")
    specs = []
    for fmt_name, fmt, w_type, group_tile_, on_acc in (
            ("bf16", FMT_DENSE, "*bf16", 1, False), ("fp16", FMT_DENSE, "*fp16", 1, False),
            ("fp32", FMT_DENSE, "*fp32", 1, False), ("int8", FMT_SCALED, "*i8", 1, True),
            ("int8-g32", FMT_SCALED, "*i8", 2, False), ("fp8", FMT_SCALED, "*fp8e4nv", 1, True),
            ("int4-g32", FMT_INT4, "*u8", 2, False), ("int4-g128", FMT_INT4, "*u8", 1, False)):
        act = "*fp32" if fmt_name == "fp32" else "*bf16"
        for fn, extra in ((moe_gate_up_kernel, dict(TOP_K=8)), (moe_down_kernel, dict(SCALE_FP32=False))):
            block_k = FP32_BLOCK_K if fmt_name == "fp32" else BLOCK_K
            constexprs = dict(FMT=fmt, SCALE_ON_ACC=on_acc, GROUP_TILE=group_tile_, BLOCK_M=SMALL_BLOCK_M,
                              BLOCK_N=BLOCK_N, BLOCK_K=block_k, **extra)
            types = dict(x_ptr=act, act_ptr=act, out_ptr=act, table_ptr="*i64", like_ptr=w_type, sorted_ptr="*i64",
                         block_expert_ptr="*i64", topk_w_ptr="*fp32")
            label = f"{fn.__name__} W={fmt_name} tile={SMALL_BLOCK_M}x{BLOCK_N}x{block_k}"
            specs.append(CompileSpec("fused_moe", label, fn, signature_of(fn, types, constexprs), constexprs,
                                     4, tuple(a for a in aligned if a in fn.arg_names)))
    return specs
