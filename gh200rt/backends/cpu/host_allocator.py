"""Keep freed activation memory mapped between steps when the engine computes on the CPU.

glibc's malloc hands a large freed block back to the kernel: a chunk above ``M_MMAP_THRESHOLD`` is
unmapped, and a free heap top above ``M_TRIM_THRESHOLD`` is trimmed. A step's activations are
freed at the end of the step and allocated again, at the same sizes, by the next one, so every
step faults its pages in anew: a 1024-token prefill step of SmolLM2-135M took ~91,000 minor page
faults (~360 MB of zeroed pages) and about a fifth of its CPU time. With both thresholds raised
the pages stay in the heap and the next step reuses them (what preloading tcmalloc or jemalloc does
for vLLM's CPU backend). The setting is process-wide: the process keeps up to ``TRIM_THRESHOLD``
bytes of freed heap for reuse instead of returning them at once; blocks above ``MMAP_THRESHOLD``
(rare one-offs such as a long prompt's full logits) are still mapped and unmapped per use.

Kept pages are for the next step, not for ever: once the engine has nothing to run, the server
calls ``release_freed_memory()`` and the heap's free pages go back to the kernel, so a burst's
activations do not stay resident while the server is idle (the next burst faults them in once).
"""
from __future__ import annotations

import ctypes
import logging

log = logging.getLogger("gh200rt.engine")

M_TRIM_THRESHOLD = -1               # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 256 << 20
TRIM_THRESHOLD = 1 << 30


def _glibc():
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version        # only glibc has it; musl's mallopt is a no-op
        return libc
    except (OSError, AttributeError, TypeError):   # TypeError: no CDLL(None) on Windows
        return None


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds; False where the C library is not glibc."""
    libc = _glibc()
    if libc is None:
        return False
    ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    if not ok:
        log.warning("glibc refused the malloc thresholds; CPU steps will page-fault their activations anew")
    return ok


def release_freed_memory() -> bool:
    """Give the heap's free pages back to the kernel (glibc's ``malloc_trim``, every arena); False where
    the C library is not glibc."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
