"""Batched LoRA: ``y[t] += (x[t] @ A[s]^T) @ B[s]^T * scale[s]`` with ``s`` the slot of token ``t`` (-1: none).

The step's tokens come as **segments**, runs of consecutive tokens with one slot (a sequence's tokens are
consecutive, so a segment is at least one sequence), as punica's SGMV takes them: each program works on a tile
of one segment, so every tile reads one adapter's A and B. Two kernels: *shrink* ``v = x @ A^T * scale``
(float32, ``[T, R]``) and *expand* ``y += v @ B^T``. ``A [S, R, K]``, ``B [S, N, R]`` are the device slots
(``gh200rt/lora/slots.py``); a rank below R is zero-padded there, so it adds nothing. Operands are widened to
float32 before ``tl.dot``: bf16 and fp16 values are exact in tf32, the products accumulate in float32 (and the
interpreter has no bf16 matmul). A float32 model multiplies in full float32 (``IEEE``).

``gh200rt/lora/grouped.py`` holds the torch path (the CPU's): one pair of matmuls per slot over all its rows.
``reference_lora_add`` is the plain per-token definition both are tested against.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from gh200rt.kernels.triton.compile_specs import CompileSpec, signature_of

BLOCK_M, BLOCK_K, BLOCK_N = 16, 64, 64


@triton.jit
def _segment(seg_ptr, seg):
    """Segment ``seg``'s (slot, first token, tokens): one adapter's consecutive tokens."""
    return (tl.load(seg_ptr + seg * 3), tl.load(seg_ptr + seg * 3 + 1).to(tl.int64),
            tl.load(seg_ptr + seg * 3 + 2))


@triton.jit
def _tile(mb, length, R, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr):
    """Row block ``mb`` of a segment of ``length`` tokens, and the rank columns: offsets and masks."""
    rows = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_r = tl.arange(0, BLOCK_R)
    return rows, rows < length, offs_r, offs_r < R


@triton.jit
def lora_shrink_kernel(x_ptr, a_ptr, v_ptr, scale_ptr, seg_ptr, K, R, stride_x, stride_as, stride_ar, stride_v,
                       IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr):
    seg, mb = tl.program_id(0), tl.program_id(1)
    slot, start, length = _segment(seg_ptr, seg)
    if mb * BLOCK_M >= length:
        return
    rows, row_ok, offs_r, r_ok = _tile(mb, length, R, BLOCK_M, BLOCK_R)
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    a_base = a_ptr + slot.to(tl.int64) * stride_as
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < K
        x = tl.load(x_ptr + (start + rows)[:, None] * stride_x + offs_k[None, :],
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        a = tl.load(a_base + offs_r[None, :] * stride_ar + offs_k[:, None], mask=r_ok[None, :] & k_ok[:, None],
                    other=0.0)                                               # [BLOCK_K, BLOCK_R] = A[slot]^T
        if IEEE:
            acc += tl.dot(x.to(tl.float32), a.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(x.to(tl.float32), a.to(tl.float32), input_precision="tf32")
    acc *= tl.load(scale_ptr + slot)
    tl.store(v_ptr + (start + rows)[:, None] * stride_v + offs_r[None, :], acc,
             mask=row_ok[:, None] & r_ok[None, :])


@triton.jit
def lora_expand_kernel(v_ptr, b_ptr, y_ptr, seg_ptr, N, R, stride_v, stride_bs, stride_bn, stride_y,
                       IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    seg, mb, nb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot, start, length = _segment(seg_ptr, seg)
    if mb * BLOCK_M >= length:      # (the early return stays in the kernel: a helper cannot end it)
        return
    rows, row_ok, offs_r, r_ok = _tile(mb, length, R, BLOCK_M, BLOCK_R)
    offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    v = tl.load(v_ptr + (start + rows)[:, None] * stride_v + offs_r[None, :], mask=row_ok[:, None] & r_ok[None, :],
                other=0.0)
    b = tl.load(b_ptr + slot.to(tl.int64) * stride_bs + offs_n[None, :] * stride_bn + offs_r[:, None],
                mask=n_ok[None, :] & r_ok[:, None], other=0.0)                # [BLOCK_R, BLOCK_N] = B[slot]^T
    if IEEE:
        delta = tl.dot(v, b.to(tl.float32), input_precision="ieee")
    else:
        delta = tl.dot(v, b.to(tl.float32), input_precision="tf32")
    y_ptrs = y_ptr + (start + rows)[:, None] * stride_y + offs_n[None, :]
    ok = row_ok[:, None] & n_ok[None, :]
    y = tl.load(y_ptrs, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptrs, (y + delta).to(y_ptr.dtype.element_ty), mask=ok)


def lora_add_triton(x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scales: torch.Tensor,
                    segs: torch.Tensor, max_len: int) -> torch.Tensor:
    """``y += per-token LoRA delta`` in place, over ``segs`` (int32 ``[S, 3]`` of (slot, start, length); tokens
    outside any segment are left alone); ``max_len``: the longest segment. ``x [T, K]``, ``y [T, N]`` with unit
    column stride."""
    num_segs = segs.shape[0]
    if num_segs == 0:
        return y
    _, r, k = a.shape
    n = b.shape[1]
    assert x.stride(1) == 1 and y.stride(1) == 1 and a.is_contiguous() and b.is_contiguous()
    v = torch.empty(x.shape[0], r, dtype=torch.float32, device=x.device)
    block_r = max(16, triton.next_power_of_2(r))
    ieee = x.dtype == torch.float32
    m_blocks = triton.cdiv(max_len, BLOCK_M)
    lora_shrink_kernel[(num_segs, m_blocks)](x, a, v, scales, segs, k, r, x.stride(0), a.stride(0), a.stride(1),
                                             v.stride(0), IEEE=ieee, BLOCK_M=BLOCK_M, BLOCK_K=BLOCK_K,
                                             BLOCK_R=block_r)
    lora_expand_kernel[(num_segs, m_blocks, triton.cdiv(n, BLOCK_N))](
        v, b, y, segs, n, r, v.stride(0), b.stride(0), b.stride(1), y.stride(0), IEEE=ieee, BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N, BLOCK_R=block_r)
    return y


def reference_lora_add(x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scales: torch.Tensor,
                       token_slots: torch.Tensor) -> torch.Tensor:
    """The definition, token by token in float32: a new tensor ``y + delta``."""
    out = y.float().clone()
    for t, slot in enumerate(token_slots.tolist()):
        if slot >= 0:
            out[t] += (x[t].float() @ a[slot].float().T) @ b[slot].float().T * float(scales[slot])
    return out.to(y.dtype)


def compile_specs():
    specs = []
    for dtype in ("bf16", "fp16", "fp32"):
        ieee, block_r = dtype == "fp32", 32
        shrink = dict(IEEE=ieee, BLOCK_M=BLOCK_M, BLOCK_K=BLOCK_K, BLOCK_R=block_r)
        types = dict(x_ptr=f"*{dtype}", a_ptr=f"*{dtype}", v_ptr="*fp32", scale_ptr="*fp32", seg_ptr="*i32")
        specs.append(CompileSpec("lora_shrink", f"{dtype} R<={block_r}", lora_shrink_kernel,
                                 signature_of(lora_shrink_kernel, types, shrink), shrink, 4,
                                 ("x_ptr", "a_ptr", "v_ptr", "scale_ptr", "seg_ptr")))
        expand = dict(IEEE=ieee, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_R=block_r)
        types = dict(v_ptr="*fp32", b_ptr=f"*{dtype}", y_ptr=f"*{dtype}", seg_ptr="*i32")
        specs.append(CompileSpec("lora_expand", f"{dtype} R<={block_r}", lora_expand_kernel,
                                 signature_of(lora_expand_kernel, types, expand), expand, 4,
                                 ("v_ptr", "b_ptr", "y_ptr", "seg_ptr")))
    return specs
