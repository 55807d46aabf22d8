"""Fused residual add + RMSNorm: ``residual' = x + residual``; ``y = residual' / rms(residual') * weight``.

With ``residual=None`` it is a plain RMSNorm and returns ``(y, x)`` so callers can chain layers the
same way (the vLLM convention). Math in float32; outputs in x's dtype. One program per row. The sum is rounded
to x's dtype before it is normalised, as the separate add stores it (and as transformers' layers normalise it), so
fusing the add does not change which value the norm sees.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from gh200rt.kernels.triton.compile_specs import CompileSpec, signature_of


@triton.jit
def rmsnorm_kernel(x_ptr, res_ptr, w_ptr, y_ptr, res_out_ptr, H, stride_x, stride_r, stride_y, stride_ro, eps,
                   HAS_RESIDUAL: tl.constexpr, BLOCK_H: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # int64: T * H passes 2^31 in long prefills
    offs = tl.arange(0, BLOCK_H)
    ok = offs < H
    x = tl.load(x_ptr + row * stride_x + offs, mask=ok, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x += tl.load(res_ptr + row * stride_r + offs, mask=ok, other=0.0).to(tl.float32)
        x = x.to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_ro + offs, x, mask=ok)
        x = x.to(tl.float32)
    inv_rms = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)
    w = tl.load(w_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + offs, (x * inv_rms * w).to(y_ptr.dtype.element_ty), mask=ok)


def fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                      eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(normed, new_residual)`` for x / residual ``[T, H]``."""
    t, h = x.shape
    y = torch.empty_like(x)
    res_out = torch.empty_like(x) if residual is not None else x
    res_in = residual if residual is not None else x
    rmsnorm_kernel[(t,)](x, res_in, weight, y, res_out, h, x.stride(0), res_in.stride(0), y.stride(0),
                         res_out.stride(0), eps, HAS_RESIDUAL=residual is not None,
                         BLOCK_H=triton.next_power_of_2(h), num_warps=4 if h <= 4096 else 8)
    return y, res_out


def reference_fused_add_rmsnorm(x, residual, weight, eps):
    s = x.float() if residual is None else (x.float() + residual.float()).to(x.dtype).float()
    y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return y.to(x.dtype), s.to(x.dtype)


def compile_specs():
    specs = []
    for h, dtype, has_res in ((576, "bf16", True), (4096, "bf16", True), (8192, "fp16", False)):
        constexprs = dict(HAS_RESIDUAL=has_res, BLOCK_H=triton.next_power_of_2(h))
        types = dict(x_ptr=f"*{dtype}", res_ptr=f"*{dtype}", w_ptr=f"*{dtype}", y_ptr=f"*{dtype}",
                     res_out_ptr=f"*{dtype}", eps="fp32")
        specs.append(CompileSpec("rmsnorm", f"H={h} {dtype} residual={has_res}", rmsnorm_kernel,
                                 signature_of(rmsnorm_kernel, types, constexprs), constexprs,
                                 4 if h <= 4096 else 8, ("x_ptr", "res_ptr", "w_ptr", "y_ptr", "res_out_ptr", "H",
                                  "stride_x", "stride_r", "stride_y", "stride_ro")))
    return specs
