"""Programmatic dependent launch (Hopper): a kernel launched with it may be scheduled while the kernel before it on
the stream drains, so a decode step's chain of small launches stops paying a launch gap at every boundary (the third
H100 run measured ~0.6 ms of a 6.4 ms batch-1 step idle between 344 kernels).

A kernel that takes ``USE_PDL`` calls ``wait_for_previous`` before it reads or writes any memory: the wait returns
once every kernel before it on the stream has completed and its writes are visible, so nothing it touches can race
the previous kernel (a read of its output, or a write over a buffer it still reads). Only index arithmetic runs
before the wait. ``allow_next`` (after a kernel's main loop) lets the next kernel's programs be scheduled as this
one's last programs finish; without it the next kernel is released as this one's programs exit. Both compile to
``griddepcontrol`` instructions and do nothing in a kernel launched without the attribute; ``pdl_launch(pdl)`` is
what a launch adds (``launch_pdl``). The interpreter has neither: ``USE_PDL`` is only set on CUDA.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def wait_for_previous(USE_PDL: tl.constexpr):
    if USE_PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def allow_next(USE_PDL: tl.constexpr):
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()


def pdl_launch(pdl: bool) -> dict:
    """The launch options of a kernel launched with ``USE_PDL=pdl``."""
    return {"launch_pdl": True} if pdl else {}
