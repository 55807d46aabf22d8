"""``y = x @ W.T (+ bias)`` for one row of x (decode at batch 1): a GEMV that streams W once.

W is what ``host_gemm`` takes (dense bf16/fp16/fp32 ``[N, K]`` or a ``PackedWeight``), in HBM or in host memory.
At one row the work is all weight bytes, so the kernel is shaped for the load path alone: each program owns
``BLOCK_N`` output channels across the whole K and adds ``x * w`` element-wise into a ``[BLOCK_N, BLOCK_K]``
float32 tile, reducing across K once after the loop (no cross-thread reduction inside it). With no split over K
there are no atomics, no zero-filled float32 buffer and no cast afterwards: one launch per product, which at
decode sizes (10-100 us per product) is a real share of the time. Quantized codes are dequantized per element
(``w = q * s (+ m)``: the scale of a group is one cached load for all its codes); per-channel scales (one group
spanning K) scale the reduced sum instead. Every load is upcast to float32 before arithmetic (the interpreter
gets bf16 math wrong; fp32 accumulation is what we want on the GPU anyway).

``python -m gh200rt.bench kernel gemv`` times it against cuBLAS (resident) and ``host_gemm`` (host memory) per tile shape;
``GEMV_TILE`` is the shape that measured best on an H100 (docs/BENCHMARKS.md).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from gh200rt.formats.packed_weight import PackedWeight
from gh200rt.kernels.triton.compile_specs import CompileSpec, signature_of
from gh200rt.kernels.triton.pdl import allow_next, pdl_launch, wait_for_previous
from gh200rt.kernels.triton.weight_operands import FMT_DENSE, FMT_INT4, FMT_SCALED, reference_host_gemm, weight_operands

NUM_WARPS = 4
# (BLOCK_N, BLOCK_K in codes). On an H100 (python -m gh200rt.bench kernel gemv, docs/BENCHMARKS.md) this tile was the
# fastest or within noise of it for every format and Llama-3-8B product, in HBM and in host memory.
GEMV_TILE = (8, 512)
PROLOGUE_NONE, PROLOGUE_RMS_NORM, PROLOGUE_SILU_MUL = 0, 1, 2   # gemv_kernel's PROLOGUE
MAX_NORM_COLUMNS = 16384   # a fused norm holds the whole row in registers: 128 floats a thread at 4 warps


@triton.jit
def _input_tile(x_ptr, norm_w_ptr, offs_k, k_ok, K, inv_rms, PROLOGUE: tl.constexpr):
    """x[offs_k] in float32, through the prologue: 1 RMS-normalised with the norm's weight, 2 SiLU(gate) * up of a
    gate|up row; either rounded to x's dtype as the unfused kernel stored it (kernels/triton/rmsnorm.py, silu_mul.py)."""
    if PROLOGUE == 2:
        gate = tl.load(x_ptr + offs_k, mask=k_ok, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + K + offs_k, mask=k_ok, other=0.0).to(tl.float32)
        x = (gate / (1.0 + tl.exp(-gate)) * up).to(x_ptr.dtype.element_ty).to(tl.float32)
    else:
        x = tl.load(x_ptr + offs_k, mask=k_ok, other=0.0).to(tl.float32)
        if PROLOGUE == 1:
            w = tl.load(norm_w_ptr + offs_k, mask=k_ok, other=0.0).to(tl.float32)
            x = (x * inv_rms * w).to(x_ptr.dtype.element_ty).to(tl.float32)
    return x


@triton.jit
def gemv_kernel(x_ptr, w_ptr, scale_ptr, min_ptr, bias_ptr, norm_w_ptr, res_ptr, y_ptr, N, K, stride_wn,
                stride_sn, group_size, eps,
                FMT: tl.constexpr, PER_CHANNEL: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
                PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK_H: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    wait_for_previous(USE_PDL)
    inv_rms = 0.0
    if PROLOGUE == 1:   # every program takes the row's RMS itself: 2 bytes a column from L2, against N x 2 of W
        offs_h = tl.arange(0, BLOCK_H)
        whole = tl.load(x_ptr + offs_h, mask=offs_h < K, other=0.0).to(tl.float32)
        inv_rms = 1.0 / tl.sqrt(tl.sum(whole * whole, axis=0) / K + eps)
    n_ok = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    s_rows = offs_n.to(tl.int64)[:, None] * stride_sn
    if FMT == 2:
        # int4 walked in bytes (byte j holds columns 2j low, 2j+1 high): weight loads stay 128-bit
        HALF: tl.constexpr = BLOCK_K // 2
        acc = tl.zeros((BLOCK_N, HALF), dtype=tl.float32)
        k_bytes = (K + 1) // 2
        for b0 in range(0, k_bytes, HALF):
            offs_b = b0 + tl.arange(0, HALF)
            if EVEN_K:
                w_mask = n_ok[:, None]
                col_ok = offs_b >= 0
            else:
                w_mask = n_ok[:, None] & (offs_b < k_bytes)[None, :]
                col_ok = offs_b * 2 < K
            packed = tl.load(w_rows + offs_b[None, :], mask=w_mask, other=0)
            x_even = tl.load(x_ptr + offs_b * 2, mask=col_ok, other=0.0).to(tl.float32)
            x_odd = tl.load(x_ptr + offs_b * 2 + 1, mask=col_ok & (offs_b * 2 + 1 < K), other=0.0).to(tl.float32)
            s_off = s_rows + (offs_b * 2 // group_size)[None, :]
            scale = tl.load(scale_ptr + s_off, mask=w_mask, other=0.0)
            minimum = tl.load(min_ptr + s_off, mask=w_mask, other=0.0)
            q_even, q_odd = (packed & 0xF).to(tl.float32), (packed >> 4).to(tl.float32)
            acc += (q_even * scale + minimum) * x_even[None, :] + (q_odd * scale + minimum) * x_odd[None, :]
    else:
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            if EVEN_K:
                w_mask = n_ok[:, None]
                k_ok = offs_k >= 0
            else:
                k_ok = offs_k < K
                w_mask = n_ok[:, None] & k_ok[None, :]
            w = tl.load(w_rows + offs_k[None, :], mask=w_mask, other=0.0).to(tl.float32)
            if FMT == 1:
                if not PER_CHANNEL:
                    w = w * tl.load(scale_ptr + s_rows + (offs_k // group_size)[None, :], mask=w_mask, other=0.0)
            x = _input_tile(x_ptr, norm_w_ptr, offs_k, k_ok, K, inv_rms, PROLOGUE)
            acc += w * x[None, :]
    allow_next(USE_PDL)
    y = tl.sum(acc, axis=1)
    if PER_CHANNEL:
        y = y * tl.load(scale_ptr + offs_n.to(tl.int64) * stride_sn, mask=n_ok, other=0.0)
    if HAS_BIAS:
        y += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:    # the product rounded as stored, then the residual add in float32 (kernels/triton/rmsnorm.py)
        y = y.to(y_ptr.dtype.element_ty).to(tl.float32) + tl.load(res_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty), mask=n_ok)


def gemv(x: torch.Tensor, weight: torch.Tensor | PackedWeight, bias: torch.Tensor | None = None,
         tile: tuple[int, int] | None = None, *, norm: tuple[torch.Tensor, float] | None = None,
         gated: bool = False, residual: torch.Tensor | None = None, pdl: bool = False) -> torch.Tensor:
    """``x[..., K] @ W[N, K].T + bias`` for x holding one row; returns x's dtype. ``tile``: (BLOCK_N, BLOCK_K)
    instead of ``GEMV_TILE`` (benchmarks). Fused into the same launch (a dense or int8/fp8 W; decode's layer,
    backends/cuda/decode_layer.py): ``norm=(weight, eps)`` takes x un-normalised and RMS-normalises it first (at most
    ``MAX_NORM_COLUMNS``); ``gated`` takes x as a ``[2K]`` gate|up row and multiplies by SiLU(gate) * up;
    ``residual`` (a row of N) is added to the product. Each rounds where the unfused kernels store. ``pdl``: launched
    with programmatic dependent launch (kernels/triton/pdl.py; CUDA, sm_90+)."""
    n, k = weight.shape
    width = 2 * k if gated else k
    if x.shape[-1] != width:
        raise ValueError(f"gemv: x has {x.shape[-1]} columns but the weight expects K={k}"
                         + (" (a gate|up row of 2K)" if gated else ""))
    assert x.numel() == width, f"gemv takes one row, not {x.numel() // width}"
    assert norm is None or not gated
    x1 = x.reshape(width).contiguous()
    fmt, w, scale, minimum, group = weight_operands(weight, x1)
    assert w.stride(-1) == 1, "weight rows must be contiguous"
    assert fmt != FMT_INT4 or (norm is None and not gated), "int4 codes take no fused prologue"
    assert norm is None or k <= MAX_NORM_COLUMNS, k
    block_n, block_k = tile or GEMV_TILE
    per_channel = fmt == FMT_SCALED and group >= k
    y = torch.empty(n, dtype=x.dtype, device=x.device)
    scale_stride = scale.stride(0) if fmt != FMT_DENSE else 0
    gemv_kernel[(triton.cdiv(n, block_n),)](
        x1, w, scale, minimum, bias if bias is not None else x1, norm[0] if norm is not None else x1,
        residual.reshape(n) if residual is not None else x1, y, n, k, w.stride(0), scale_stride, group,
        norm[1] if norm is not None else 0.0,
        FMT=fmt, PER_CHANNEL=per_channel, HAS_BIAS=bias is not None, EVEN_K=k % block_k == 0,
        PROLOGUE=PROLOGUE_RMS_NORM if norm is not None else PROLOGUE_SILU_MUL if gated else PROLOGUE_NONE,
        HAS_RESIDUAL=residual is not None, BLOCK_H=triton.next_power_of_2(k) if norm is not None else 1,
        BLOCK_N=block_n, BLOCK_K=block_k, USE_PDL=pdl, num_warps=NUM_WARPS, **pdl_launch(pdl))
    return y.reshape(*x.shape[:-1], n)


def reference_fused_gemv(x: torch.Tensor, weight, bias=None, norm=None, gated: bool = False, residual=None):
    """``gemv``'s fused prologue and epilogue in torch, rounding where the unfused kernels store; float32 product."""
    row = x.reshape(1, -1).float()
    if norm is not None:
        row = (row * torch.rsqrt(row.pow(2).mean(-1, keepdim=True) + norm[1]) * norm[0].float()).to(x.dtype).float()
    if gated:
        gate, up = row.chunk(2, dim=-1)
        row = (torch.nn.functional.silu(gate) * up).to(x.dtype).float()
    y = reference_host_gemm(row, weight, bias)
    if residual is not None:
        y = y.to(x.dtype).float() + residual.reshape(1, -1).float()
    return y.to(x.dtype).reshape(*x.shape[:-1], weight.shape[0])


reference_gemv = reference_host_gemm


# (label, FMT, weight type, code bits, group size with K = 4096)
_SPEC_WEIGHTS = (("bf16", FMT_DENSE, "*bf16", 16, 4096), ("fp32", FMT_DENSE, "*fp32", 32, 4096),
                 ("int8", FMT_SCALED, "*i8", 8, 4096), ("int8 g128", FMT_SCALED, "*i8", 8, 128),
                 ("fp8", FMT_SCALED, "*fp8e4nv", 8, 4096), ("int4 g32", FMT_INT4, "*u8", 4, 32))


def compile_specs():
    """Hopper compile checks: each weight format at its tile, K a multiple of the tile (the decode shapes), and the
    fused prologues and residual of a bf16 decode layer's products (Llama-3-8B's K)."""
    fn = gemv_kernel
    aligned = ("x_ptr", "w_ptr", "scale_ptr", "min_ptr", "bias_ptr", "norm_w_ptr", "res_ptr", "y_ptr", "K",
               "stride_wn")
    specs = []
    block_n, block_k = GEMV_TILE
    fused = (("norm", 4096, PROLOGUE_RMS_NORM, False), ("residual", 4096, PROLOGUE_NONE, True),
             ("SiLU-mul + residual", 14336, PROLOGUE_SILU_MUL, True))
    cases = [(label, fmt, w_type, group, "", PROLOGUE_NONE, False, 4096) for label, fmt, w_type, _, group in _SPEC_WEIGHTS]
    cases += [("bf16", FMT_DENSE, "*bf16", k, f" {name} K={k}", prologue, residual, k)
              for name, k, prologue, residual in fused]
    cases.append(("bf16", FMT_DENSE, "*bf16", 4096, " norm K=4096 PDL", PROLOGUE_RMS_NORM, False, 4096))
    for label, fmt, w_type, group, fusion, prologue, residual, k in cases:
        constexprs = dict(FMT=fmt, PER_CHANNEL=fmt == FMT_SCALED and group >= 4096, HAS_BIAS=False, EVEN_K=True,
                          PROLOGUE=prologue, HAS_RESIDUAL=residual,
                          BLOCK_H=triton.next_power_of_2(k) if prologue == PROLOGUE_RMS_NORM else 1,
                          BLOCK_N=block_n, BLOCK_K=block_k, USE_PDL=fusion.endswith("PDL"))
        act = "*fp32" if label == "fp32" else "*bf16"
        types = dict(x_ptr=act, w_ptr=w_type, scale_ptr="*fp32", min_ptr="*fp32", bias_ptr=act, norm_w_ptr=act,
                     res_ptr=act, y_ptr=act, eps="fp32")
        specs.append(CompileSpec("gemv", f"W={label} tile={block_n}x{block_k}{fusion}", fn,
                                 signature_of(fn, types, constexprs), constexprs, NUM_WARPS, aligned,
                                 min_load_bits=128))
    return specs
