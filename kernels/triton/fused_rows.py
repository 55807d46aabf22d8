"""``y = prologue(x) @ W.T (+ bias) (+ residual)`` for a few rows of x against a dense 16-bit W: the products of a
decode layer at batch 2-64 with their norms, SiLU-and-mul and residual adds in the same launches
(backends/cuda/decode_layer.py), as ``gemv`` fuses them at one row.

Each program owns ``BLOCK_N`` output channels of ``BLOCK_M`` rows across the whole K: no split over K, so the
epilogue (bias, residual add, the cast) runs once per output, with no float32 partial buffer, no atomics and no
reduction launch. The product runs on tensor cores with float32 accumulation, over float32 operands (TF32 on the
GPU, as host_gemm's tiles, which measured at cuBLAS's speed) or, with ``DOT_16BIT``, over the 16-bit values
themselves (half the shared-memory reads and registers; the benchmark times both). Either way the products of
16-bit values are exact, which is why W must be bf16 or fp16: a float32 W would lose bits to TF32. The prologue rounds where the unfused kernels store (an RMS-normalised row, SiLU(gate) * up), and the
residual add takes the product rounded to x's dtype, so each launch computes what the op-by-op kernels compute up
to float32 summation order: the RMS of a row is summed across K tiles here, in one pass in kernels/triton/rmsnorm.py.

``ROWS_TILE`` is a first choice, not a measured one: ``python -m gh200rt.bench kernel skinny --fused`` times it against
cuBLAS and other tiles (docs/BENCHMARKS.md). On an H100 at eight rows the tiled kernel without a K split ran at
cuBLAS's speed on qkv (0.56 of HBM) and 0.64 against 0.70 on down with 32-channel tiles (half the SMs' worth of
programs there: 16-channel tiles double them).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from gh200rt.kernels.triton.compile_specs import CompileSpec, signature_of
from gh200rt.kernels.triton.gemv import (MAX_NORM_COLUMNS, PROLOGUE_NONE, PROLOGUE_RMS_NORM, PROLOGUE_SILU_MUL,
                                         reference_fused_gemv)
from gh200rt.kernels.triton.pdl import allow_next, pdl_launch, wait_for_previous

MAX_ROWS = 64                       # rows per call; decode's batches beyond that belong to cuBLAS
ROWS_TILE = dict(BLOCK_N=16, BLOCK_K=256, num_warps=4, DOT_16BIT=False)
# the widest K tile of each M tile that compiles for sm_90 without spills at 4 warps (scripts/check_kernels.py:
# 32 or 64 rows x 256 columns spill)
WIDEST_K_TILE = {16: 256, 32: 128, 64: 128}
# (BLOCK_N, BLOCK_K, num_warps, DOT_16BIT) per M tile that python -m gh200rt.bench kernel skinny --fused times: each compiles
# without spills for a decode layer's three fusions (wider K tiles than WIDEST_K_TILE take 8 warps)
SWEEP_TILES = {
    16: [(16, 256, 4, False), (16, 256, 4, True), (32, 256, 4, False), (32, 256, 4, True), (16, 128, 4, False),
         (32, 128, 4, False), (16, 256, 8, False), (32, 256, 8, False)],
    32: [(16, 128, 4, False), (32, 128, 4, True), (16, 256, 8, True), (32, 256, 8, True)],
    64: [(16, 128, 4, False), (16, 128, 4, True), (32, 128, 4, False), (32, 128, 4, True), (64, 128, 8, False),
         (64, 128, 8, True), (16, 64, 4, False), (32, 256, 8, True), (64, 256, 8, True)],
}


@triton.jit
def _rows_input(x_rows, norm_w_ptr, offs_k, mask, k_ok, K, inv_rms, PROLOGUE: tl.constexpr):
    """x[rows, offs_k] in float32 through the prologue (see gemv's ``_input_tile``), rounded as the unfused kernels
    store it."""
    if PROLOGUE == 2:
        gate = tl.load(x_rows + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_rows + K + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
        x = (gate / (1.0 + tl.exp(-gate)) * up).to(x_rows.dtype.element_ty).to(tl.float32)
    else:
        x = tl.load(x_rows + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
        if PROLOGUE == 1:
            w = tl.load(norm_w_ptr + offs_k, mask=k_ok, other=0.0).to(tl.float32)
            x = (x * inv_rms[:, None] * w[None, :]).to(x_rows.dtype.element_ty).to(tl.float32)
    return x


@triton.jit
def fused_rows_kernel(x_ptr, w_ptr, bias_ptr, norm_w_ptr, res_ptr, y_ptr, M, N, K, stride_xm, stride_wn,
                      stride_rm, stride_ym, eps,
                      HAS_BIAS: tl.constexpr, PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                      EVEN_K: tl.constexpr, DOT_16BIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    wait_for_previous(USE_PDL)
    m_ok, n_ok = offs_m < M, offs_n < N
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    inv_rms = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if PROLOGUE == 1:   # every program takes its rows' RMS itself: x is L2-resident, W is what streams
        squares = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_rows + offs_k[None, :], mask=m_ok[:, None] & (offs_k < K)[None, :], other=0.0)
            x = x.to(tl.float32)
            squares += x * x
        inv_rms = 1.0 / tl.sqrt(tl.sum(squares, axis=1) / K + eps)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        if EVEN_K:
            k_ok = offs_k >= 0
            w_mask = n_ok[:, None]
            x_mask = m_ok[:, None]
        else:
            k_ok = offs_k < K
            w_mask = n_ok[:, None] & k_ok[None, :]
            x_mask = m_ok[:, None] & k_ok[None, :]
        w = tl.load(w_rows + offs_k[None, :], mask=w_mask, other=0.0)
        x = _rows_input(x_rows, norm_w_ptr, offs_k, x_mask, k_ok, K, inv_rms, PROLOGUE)
        if DOT_16BIT:   # x holds 16-bit values already: the cast is exact
            acc = tl.dot(x.to(w.dtype), tl.trans(w), acc)
        else:
            acc = tl.dot(x, tl.trans(w.to(tl.float32)), acc)
    allow_next(USE_PDL)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    out_mask = m_ok[:, None] & n_ok[None, :]
    if HAS_RESIDUAL:    # the product rounded as stored, then the residual add in float32 (kernels/triton/rmsnorm.py)
        residual = tl.load(res_ptr + offs_m.to(tl.int64)[:, None] * stride_rm + offs_n[None, :], mask=out_mask,
                           other=0.0)
        acc = acc.to(y_ptr.dtype.element_ty).to(tl.float32) + residual.to(tl.float32)
    y_ptrs = y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=out_mask)


def block_rows(m: int) -> int:
    """The M tile: at least 16 (the tensor cores' smallest), at most 64."""
    return min(64, max(16, triton.next_power_of_2(m)))


def rows_tile(m: int, tile: dict | None = None) -> dict:
    """``ROWS_TILE`` with ``tile``'s entries over it, its K tile narrowed to ``WIDEST_K_TILE``, and ``BLOCK_M``."""
    cfg = dict(ROWS_TILE, **(tile or {}))
    block_m = block_rows(m)
    if tile is None or "BLOCK_K" not in tile:
        cfg["BLOCK_K"] = min(cfg["BLOCK_K"], WIDEST_K_TILE[block_m])
    return dict(cfg, BLOCK_M=block_m)


def fused_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
               norm: tuple[torch.Tensor, float] | None = None, gated: bool = False,
               residual: torch.Tensor | None = None, tile: dict | None = None, pdl: bool = False) -> torch.Tensor:
    """``x[M, K] @ W[N, K].T + bias`` for 1 <= M <= ``MAX_ROWS`` rows, W dense bf16/fp16 of x's dtype; returns x's
    dtype. ``norm=(weight, eps)``: x's rows are RMS-normalised first (K at most ``MAX_NORM_COLUMNS``); ``gated``: x is
    ``[M, 2K]`` gate|up rows multiplied as SiLU(gate) * up; ``residual`` ``[M, N]`` is added to the product.
    ``tile``: ``ROWS_TILE``'s keys, for benchmarks (``DOT_16BIT`` where the GPU compiles it: the interpreter's
    16-bit dot is numpy's). ``pdl``: launched with programmatic dependent launch (kernels/triton/pdl.py)."""
    n, k = weight.shape
    width = 2 * k if gated else k
    if x.dim() != 2 or x.shape[-1] != width:
        raise ValueError(f"fused_rows: x is {tuple(x.shape)} but the weight expects [M, {width}]"
                         + (" (gate|up rows of 2K)" if gated else ""))
    m = x.shape[0]
    assert 1 <= m <= MAX_ROWS, m
    assert weight.dtype == x.dtype and x.dtype in (torch.bfloat16, torch.float16), (weight.dtype, x.dtype)
    assert weight.stride(-1) == 1 and x.stride(-1) == 1, "rows must be contiguous"
    assert norm is None or not gated
    assert norm is None or k <= MAX_NORM_COLUMNS, k
    assert residual is None or (residual.shape == (m, n) and residual.stride(-1) == 1), residual.shape
    cfg = rows_tile(m, tile)
    block_m, block_n, block_k = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    fused_rows_kernel[(triton.cdiv(n, block_n), triton.cdiv(m, block_m))](
        x, weight, bias if bias is not None else x, norm[0] if norm is not None else x,
        residual if residual is not None else x, y, m, n, k, x.stride(0), weight.stride(0),
        residual.stride(0) if residual is not None else 0, y.stride(0), norm[1] if norm is not None else 0.0,
        HAS_BIAS=bias is not None,
        PROLOGUE=PROLOGUE_RMS_NORM if norm is not None else PROLOGUE_SILU_MUL if gated else PROLOGUE_NONE,
        HAS_RESIDUAL=residual is not None, EVEN_K=k % block_k == 0, DOT_16BIT=cfg["DOT_16BIT"], BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_K=block_k, USE_PDL=pdl, num_warps=cfg["num_warps"], **pdl_launch(pdl))
    return y


def reference_fused_rows(x: torch.Tensor, weight, bias=None, norm=None, gated: bool = False, residual=None):
    """``fused_rows`` in torch, row by row through gemv's reference (the same rounding points)."""
    return torch.cat([reference_fused_gemv(x[i:i + 1], weight, bias, norm, gated,
                                           None if residual is None else residual[i:i + 1])
                      for i in range(x.shape[0])])


def compile_specs():
    """Hopper compile checks: a Llama-3-8B decode layer's four fused products at 8 and 64 rows (bf16)."""
    fn = fused_rows_kernel
    aligned = ("x_ptr", "w_ptr", "bias_ptr", "norm_w_ptr", "res_ptr", "y_ptr", "K", "stride_xm", "stride_wn",
               "stride_rm", "stride_ym")
    products = (("qkv, norm", PROLOGUE_RMS_NORM, False, 4096), ("o, residual", PROLOGUE_NONE, True, 4096),
                ("down, SiLU-mul + residual", PROLOGUE_SILU_MUL, True, 14336))
    specs = []
    for rows, tile, pdl in ((8, None, False), (64, None, False), (8, dict(DOT_16BIT=True), False), (8, None, True)):
        cfg = rows_tile(rows, tile)
        for label, prologue, residual, k in products:
            constexprs = dict(HAS_BIAS=False, PROLOGUE=prologue, HAS_RESIDUAL=residual, EVEN_K=True,
                              DOT_16BIT=cfg["DOT_16BIT"], BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
                              BLOCK_K=cfg["BLOCK_K"], USE_PDL=pdl)
            types = dict(x_ptr="*bf16", w_ptr="*bf16", bias_ptr="*bf16", norm_w_ptr="*bf16", res_ptr="*bf16",
                         y_ptr="*bf16", eps="fp32")
            specs.append(CompileSpec("fused_rows", f"{label} K={k} rows={rows} tile={cfg['BLOCK_M']}x"
                                     f"{cfg['BLOCK_N']}x{cfg['BLOCK_K']}" + (" bf16 dot" if cfg["DOT_16BIT"] else "")
                                     + (" PDL" if pdl else ""), fn, signature_of(fn, types, constexprs),
                                     constexprs, cfg["num_warps"], aligned, min_load_bits=128))
    return specs
