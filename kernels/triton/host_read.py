"""A GPU kernel that reads host memory in place: the "direct" reader of the NUMA placement experiments.

On GH200 the kernel dereferences the host address itself (ATS: the GPU walks the CPU's page
tables); on x86 it reads the device pointer of a mapped, registered buffer over PCIe. Each program
sums a contiguous span of 64-bit words so the loads stay wide; the result is returned so the
compiler cannot drop the reads.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def sum_words_kernel(src_ptr, out_ptr, n_words, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    base = pid * BLOCK * ITERS
    acc = tl.zeros([BLOCK], dtype=tl.int64)
    for i in range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(src_ptr + offs, mask=offs < n_words, other=0)
    tl.atomic_add(out_ptr, tl.sum(acc, axis=0))


class _Pointer:
    """What Triton needs of a tensor argument: an address and an element type."""

    def __init__(self, address: int):
        self._address = address
        self.dtype = torch.int64

    def data_ptr(self) -> int:
        return self._address


def sum_words(src, n_words: int, device: str = "cuda", block: int = 1024, iters: int = 8) -> int:
    """Sum ``n_words`` int64 words at ``src`` (a tensor, or anything with ``data_ptr()`` and ``dtype``)."""
    out = torch.zeros(1, dtype=torch.int64, device=device)
    grid = (triton.cdiv(n_words, block * iters),)
    sum_words_kernel[grid](src, out, n_words, BLOCK=block, ITERS=iters)
    return int(out.item())


def sum_host_bytes(buf) -> int:
    """Read a registered ``gh200rt.numa`` HostBuffer in place from the GPU."""
    address = buf.address if _has_ats() else buf.device_pointer()
    return sum_words(_Pointer(address), buf.nbytes // 8)


def _has_ats() -> bool:
    from cuda.bindings import runtime as rt
    err, value = rt.cudaDeviceGetAttribute(rt.cudaDeviceAttr.cudaDevAttrPageableMemoryAccessUsesHostPageTables,
                                           torch.cuda.current_device())
    return err == rt.cudaError_t.cudaSuccess and value == 1


def reference_sum_words(words: torch.Tensor) -> int:
    return int(words.sum().item())
