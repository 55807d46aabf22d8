"""``y = x @ W.T (+ bias)`` for decode-sized M, reading W once from wherever it lives (host or HBM).

W is a dense bf16/fp16/fp32 ``[N, K]`` tensor or a ``PackedWeight`` (int8 per channel/group, fp8 e4m3
per channel, int4 per group with scale and minimum; see gh200rt/formats/packed_layout.py). int8 and fp8 take the same route
(``FMT_SCALED``): the load's element type decides the upcast. Every load is upcast to float32 before
arithmetic (the Triton interpreter gets bf16 math wrong, and fp32 accumulation is what we want on the
GPU anyway). The weight tile is contiguous along K, so with 16-byte aligned rows the loads are 128-bit.
M > 1 uses tensor cores (``tl.dot``, TF32 on the GPU: exact products where both operands are bf16/fp16
values or quantized codes, ~1e-3 relative error where one is float32 or a dequantized tile; the
interpreter computes in full fp32). Small M gives few output tiles, so K is split across programs
(``split_k``) and partial sums are added atomically into a float32 buffer, which keeps every SM
streaming weight bytes. Weights are read once per call per M-tile (up to 64 rows), so the kernel
targets M <= 256 (decode); prefill-sized M belongs to a tiled matmul.

Quantized tiles are multiplied as raw codes and scaled afterwards (``scale_mode``), so a program loads
one scale per output channel and group, not one per weight element: one group spanning K
(``PER_CHANNEL``) scales the accumulator after the K loop (each split's partial sum on its own: the
scaling is linear); groups a K tile fits inside (a power of two, at least the 128-wide M = 1 tile) scale each
tile's partial product (``PER_TILE``); int4's minimum adds ``minimum * sum(x)`` over the same columns
(``w = q*s + m``, so ``x.w = s*(x.q) + m*sum(x)``). Other group sizes gather a scale per element
(``PER_ELEMENT``): correct for every group size, and as many scale loads as weight loads.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from gh200rt.formats.packed_weight import PackedWeight
from gh200rt.kernels.triton.compile_specs import CompileSpec, signature_of
from gh200rt.kernels.triton.gemv import gemv
from gh200rt.kernels.triton.weight_operands import FMT_DENSE, FMT_INT4, FMT_SCALED, weight_operands

# where a quantized tile meets its scales (the kernel's SCALES)
SCALES_NONE, PER_CHANNEL, PER_TILE, PER_ELEMENT = (tl.constexpr(mode) for mode in range(4))
TARGET_PROGRAMS = 132 * 4  # H100/GH200 SM count x programs resident per SM
NUM_WARPS = 4
MIN_TILE_BYTES = 32 * NUM_WARPS * 16  # 16 bytes of every weight tile per thread: 128-bit loads
MIN_ROW_BYTES = 16                    # a K tile's bytes of one weight row: at least one 128-bit load
FEW_ROW_K_BYTES = 128                 # M > 1: a K tile's bytes of one weight row (tile_config)...
MAX_X_TILE = 16 * 256                 # ...with at most this many elements of x in a tile
MIN_TILE_GROUP = 128                  # per-tile scales only for groups at least the M = 1 tile's K (scale_mode)


@triton.jit
def _accumulate(acc, x, w, USE_DOT: tl.constexpr):
    """acc[BM, BN] += x[BM, BK] @ w[BN, BK].T, both float32."""
    if USE_DOT:
        return tl.dot(x, tl.trans(w), acc)
    return acc + tl.sum(x[:, None, :] * w[None, :, :], axis=2)


@triton.jit
def _add_scaled_tile(acc, partial, x_sum, scale_rows, min_rows, group, n_ok, HAS_MIN: tl.constexpr):
    """``acc + partial * scale (+ x_sum * minimum)`` for a K tile of raw codes inside group ``group``."""
    acc += partial * tl.load(scale_rows + group, mask=n_ok, other=0.0)[None, :]
    if HAS_MIN:
        acc += x_sum[:, None] * tl.load(min_rows + group, mask=n_ok, other=0.0)[None, :]
    return acc


@triton.jit
def host_gemm_kernel(x_ptr, w_ptr, scale_ptr, min_ptr, bias_ptr, y_ptr,
                     M, N, K, k_packed, stride_xm, stride_wn, stride_sn, stride_ym, group_size, split_len,
                     FMT: tl.constexpr, SCALES: tl.constexpr, HAS_BIAS: tl.constexpr, ATOMIC: tl.constexpr,
                     USE_DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n, pid_k, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = offs_m < M, offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    x_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)   # sum of x over the columns read (int4 per channel)
    x_rows = x_ptr + offs_m[:, None] * stride_xm
    scale_rows = scale_ptr + offs_n * stride_sn
    min_rows = min_ptr + offs_n * stride_sn
    if FMT == 2:
        # int4 is walked in bytes (byte j holds columns 2j low, 2j+1 high) so the alignment of the
        # byte offsets is visible to the compiler and weight loads stay 128-bit.
        HALF: tl.constexpr = BLOCK_K // 2
        b_start = pid_k * split_len
        b_end = tl.minimum(b_start + split_len, k_packed)
        for b0 in range(b_start, b_end, HALF):
            offs_b = b0 + tl.arange(0, HALF)
            w_mask = n_ok[:, None] & (offs_b < b_end)[None, :]
            packed = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_b[None, :], mask=w_mask, other=0)
            col_even = offs_b * 2
            x_even = tl.load(x_rows + col_even[None, :], mask=m_ok[:, None] & (col_even < K)[None, :],
                             other=0.0).to(tl.float32)
            x_odd = tl.load(x_rows + col_even[None, :] + 1, mask=m_ok[:, None] & (col_even + 1 < K)[None, :],
                            other=0.0).to(tl.float32)
            q_even, q_odd = (packed & 0xF).to(tl.float32), (packed >> 4).to(tl.float32)
            if SCALES == PER_ELEMENT:
                s_off = offs_n[:, None] * stride_sn + (col_even // group_size)[None, :]
                scale = tl.load(scale_ptr + s_off, mask=w_mask, other=0.0)
                minimum = tl.load(min_ptr + s_off, mask=w_mask, other=0.0)
                acc = _accumulate(acc, x_even, q_even * scale + minimum, USE_DOT)
                acc = _accumulate(acc, x_odd, q_odd * scale + minimum, USE_DOT)
            elif SCALES == PER_TILE:
                partial = _accumulate(tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), x_even, q_even, USE_DOT)
                partial = _accumulate(partial, x_odd, q_odd, USE_DOT)
                acc = _add_scaled_tile(acc, partial, tl.sum(x_even + x_odd, axis=1), scale_rows, min_rows,
                                       2 * b0 // group_size, n_ok, True)
            else:
                acc = _accumulate(_accumulate(acc, x_even, q_even, USE_DOT), x_odd, q_odd, USE_DOT)
                x_sum += tl.sum(x_even + x_odd, axis=1)
    else:
        k_start = pid_k * split_len
        k_end = tl.minimum(k_start + split_len, K)
        for k0 in range(k_start, k_end, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_ok = offs_k < k_end
            w_mask = n_ok[:, None] & k_ok[None, :]
            w = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :], mask=w_mask, other=0.0).to(tl.float32)
            x = tl.load(x_rows + offs_k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
            if SCALES == PER_ELEMENT:
                group = offs_k // group_size
                w = w * tl.load(scale_ptr + offs_n[:, None] * stride_sn + group[None, :], mask=w_mask, other=0.0)
                acc = _accumulate(acc, x, w, USE_DOT)
            elif SCALES == PER_TILE:
                partial = _accumulate(tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), x, w, USE_DOT)
                acc = _add_scaled_tile(acc, partial, x_sum, scale_rows, min_rows, k0 // group_size, n_ok, False)
            else:
                acc = _accumulate(acc, x, w, USE_DOT)
    if SCALES == PER_CHANNEL:
        acc = _add_scaled_tile(tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), acc, x_sum, scale_rows, min_rows,
                               0, n_ok, FMT == 2)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
        acc += bias[None, :] * (pid_k == 0).to(tl.float32)  # only one split adds the bias
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    out_mask = m_ok[:, None] & n_ok[None, :]
    if ATOMIC:
        tl.atomic_add(y_ptrs, acc, mask=out_mask)
    else:
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=out_mask)


def scale_mode(fmt: int, group_size: int, k: int, weight_bits: int) -> tl.constexpr:
    """Where the kernel applies the scales of a weight with ``weight_bits``-bit codes (module docstring)."""
    if fmt == FMT_DENSE:
        return SCALES_NONE
    if group_size >= k:
        return PER_CHANNEL
    power_of_two = group_size & (group_size - 1) == 0
    # Groups narrower than the widest default K tile would shrink the K tiles to the group: on an H100 int4 g32
    # read that way (16 bytes of a row per step) ran 2-5x slower than per-element scales over 128-wide tiles.
    return PER_TILE if power_of_two and group_size >= MIN_TILE_GROUP else PER_ELEMENT


def tile_config(m: int, weight_bits: int = 16, group_size: int | None = None) -> dict:
    """M = 1: a multiply-reduce tile (no wasted MMA rows). M > 1: tensor-core tiles of 16-64 rows.

    ``group_size`` (per-tile scales): K tiles lie inside one group. Where that narrows the K tile, the N tile
    widens: each thread gets at least 16 bytes of every weight tile, so weight loads stay 128-bit.
    """
    if m == 1:
        use_dot, block_m, block_n, block_k = False, 1, 32, 128
    else:
        # K tiles of FEW_ROW_K_BYTES of each weight row, N tiles of 32 rows for 4-bit codes: on an H100 at M = 8
        # int4 g32 from host memory ran at 0.36-0.38 of the link with 64x64 tiles (32 bytes of a row per step)
        # and 0.72-0.89 with 32x256 (python -m gh200rt.bench kernel skinny, docs/gpu-runs/h100-2026-11-26b). The x tile
        # stays within MAX_X_TILE elements: 64 float32 rows x 256 over three stages outgrow shared memory.
        use_dot, block_m = True, min(64, max(16, triton.next_power_of_2(m)))
        block_n = 64 if weight_bits >= 8 else 32
        block_k = max(64, min(FEW_ROW_K_BYTES * 8 // weight_bits, MAX_X_TILE // block_m))
    if group_size is not None:
        block_k = min(block_k, group_size)
    block_n = max(block_n, MIN_TILE_BYTES * 8 // (block_k * weight_bits))
    return dict(USE_DOT=use_dot, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=NUM_WARPS)


def choose_split_k(m: int, n: int, k: int, cfg: dict, target_programs: int = TARGET_PROGRAMS) -> int:
    tiles = triton.cdiv(n, cfg["BLOCK_N"]) * triton.cdiv(m, cfg["BLOCK_M"])
    return max(1, min(triton.cdiv(target_programs, tiles), triton.cdiv(k, cfg["BLOCK_K"])))


def host_gemm(x: torch.Tensor, weight: torch.Tensor | PackedWeight, bias: torch.Tensor | None = None,
              split_k: int | None = None) -> torch.Tensor:
    """``x[..., K] @ W[N, K].T + bias`` with W dense or packed; returns x's dtype. One row of x goes to the GEMV
    (``gemv.py``: one launch, no split) unless ``split_k`` asks for this kernel's split."""
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"host_gemm: x has {x.shape[-1]} columns but the weight expects K={k}")
    if split_k is None and x.numel() == k:
        return gemv(x, weight, bias)
    return tiled_host_gemm(x, weight, bias, split_k)


def tiled_host_gemm(x: torch.Tensor, weight: torch.Tensor | PackedWeight, bias: torch.Tensor | None = None,
                    split_k: int | None = None) -> torch.Tensor:
    """``host_gemm`` through this module's tiled kernel at any M (``split_k``: splits of K, default ``choose_split_k``)."""
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"host_gemm: x has {x.shape[-1]} columns but the weight expects K={k}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k).contiguous()
    m = x2.shape[0]
    fmt, w, scale, minimum, group = weight_operands(weight, x2)
    assert w.stride(-1) == 1, "weight rows must be contiguous"
    bits = 4 if fmt == FMT_INT4 else 8 * w.element_size()
    scales = scale_mode(fmt, group, k, bits)
    cfg = tile_config(m, bits, group if scales == PER_TILE else None)
    split = split_k or choose_split_k(m, n, k, cfg)
    # whole K tiles per split: a tile never straddles two splits, and with per-tile scales never two groups
    k_per_split = triton.cdiv(triton.cdiv(k, split), cfg["BLOCK_K"]) * cfg["BLOCK_K"]
    split = triton.cdiv(k, k_per_split)
    atomic = split > 1
    y = (torch.zeros if atomic else torch.empty)((m, n), dtype=torch.float32 if atomic else x.dtype, device=x.device)
    grid = (triton.cdiv(n, cfg["BLOCK_N"]), split, triton.cdiv(m, cfg["BLOCK_M"]))
    host_gemm_kernel[grid](
        x2, w, scale, minimum, bias if bias is not None else x2, y,
        m, n, k, w.shape[1], x2.stride(0), w.stride(0), scale.stride(0), y.stride(0), group,
        k_per_split // 2 if fmt == FMT_INT4 else k_per_split,  # in the units of a weight row (bytes for int4)
        FMT=fmt, SCALES=scales, HAS_BIAS=bias is not None, ATOMIC=atomic, **cfg)
    return y.to(x.dtype).reshape(*lead, n)


# (label, FMT, weight type, code bits, group size with K = 4096: what scale_mode then picks)
_SPEC_WEIGHTS = (("fp32", FMT_DENSE, "*fp32", 32, 4096), ("bf16", FMT_DENSE, "*bf16", 16, 4096),
                 ("fp16", FMT_DENSE, "*fp16", 16, 4096), ("int8", FMT_SCALED, "*i8", 8, 4096),
                 ("int8 g32", FMT_SCALED, "*i8", 8, 32), ("int8 g128", FMT_SCALED, "*i8", 8, 128),
                 ("int8 g48", FMT_SCALED, "*i8", 8, 48), ("fp8", FMT_SCALED, "*fp8e4nv", 8, 4096),
                 ("int4 g32", FMT_INT4, "*u8", 4, 32), ("int4 g128", FMT_INT4, "*u8", 4, 128),
                 ("int4 g16", FMT_INT4, "*u8", 4, 16))


def compile_specs():
    """Hopper compile checks: each weight format and scale route at decode (M=1), small batch (M=8) and M=256 tiles."""
    fn = host_gemm_kernel
    aligned = ("x_ptr", "w_ptr", "scale_ptr", "min_ptr", "bias_ptr", "y_ptr",
               "K", "k_packed", "stride_xm", "stride_wn", "stride_ym", "split_len")
    specs = []
    for fmt_name, fmt, w_type, bits, group in _SPEC_WEIGHTS:
        scales = scale_mode(fmt, group, 4096, bits)
        # an fp32 model's weights meet fp32 activations, and so may its quantized ones (the widest x tiles)
        float_x = ((32, True, "*fp32"), (256, False, "*fp32")) if fmt != FMT_DENSE else ()
        for m, atomic, act in ((1, True, None), (8, True, None), (256, False, None)) + float_x:
            cfg = tile_config(m, bits, group if scales == PER_TILE else None)
            num_warps = cfg.pop("num_warps")
            constexprs = dict(FMT=fmt, SCALES=scales.value, HAS_BIAS=m == 8, ATOMIC=atomic, **cfg)
            act = act or ("*fp32" if fmt_name == "fp32" else "*bf16")
            types = dict(x_ptr=act, w_ptr=w_type, scale_ptr="*fp32", min_ptr="*fp32",
                         bias_ptr=act, y_ptr="*fp32" if atomic else act)
            route = {PER_CHANNEL: " per-channel", PER_TILE: " per-tile", PER_ELEMENT: " per-element"}.get(scales, "")
            label = f"W={fmt_name}{route} x={act[1:]} M={m} tile={cfg['BLOCK_M']}x{cfg['BLOCK_N']}x{cfg['BLOCK_K']} " \
                    f"split_k={'on' if atomic else 'off'}"
            specs.append(CompileSpec("host_gemm", label, fn, signature_of(fn, types, constexprs), constexprs,
                                     num_warps, aligned, min_load_bits=128))
    return specs

