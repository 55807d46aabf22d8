"""SiLU-and-multiply: ``y = silu(x[..., :I]) * x[..., I:]`` for the fused gate/up projection output."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from gh200rt.kernels.triton.compile_specs import CompileSpec, signature_of

BLOCK = 1024


@triton.jit
def silu_mul_kernel(x_ptr, y_ptr, inter, stride_x, stride_y, BLOCK: tl.constexpr):
    row, col_block = tl.program_id(0).to(tl.int64), tl.program_id(1)  # int64: T * 2I passes 2^31
    offs = col_block * BLOCK + tl.arange(0, BLOCK)
    ok = offs < inter
    gate = tl.load(x_ptr + row * stride_x + offs, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + offs, mask=ok, other=0.0).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(y_ptr + row * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=ok)


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    """``x[T, 2I] -> y[T, I]``."""
    t, two_i = x.shape
    if two_i % 2:
        raise ValueError(f"silu_mul needs an even last dimension (gate and up halves), got {two_i}")
    inter = two_i // 2
    x = x.contiguous()
    y = torch.empty(t, inter, dtype=x.dtype, device=x.device)
    silu_mul_kernel[(t, triton.cdiv(inter, BLOCK))](x, y, inter, x.stride(0), y.stride(0), BLOCK=BLOCK)
    return y


def reference_silu_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(x.dtype)


def compile_specs():
    specs = []
    for dtype in ("bf16", "fp16", "fp32"):
        constexprs = dict(BLOCK=BLOCK)
        types = dict(x_ptr=f"*{dtype}", y_ptr=f"*{dtype}")
        specs.append(CompileSpec("silu_mul", f"{dtype} BLOCK={BLOCK}", silu_mul_kernel,
                                 signature_of(silu_mul_kernel, types, constexprs), constexprs, 4,
                                 ("x_ptr", "y_ptr", "inter", "stride_x", "stride_y")))
    return specs
