"""A CPU engine keeps freed activation memory in the heap for the next step instead of handing it
back to the kernel (and faulting it in again).

Each case runs in a fresh interpreter: the malloc thresholds are process-wide, and this test
process may already have built an engine. ``mallinfo2`` tells where a block came from: ``hblkhd``
counts mmapped blocks, ``arena`` the heap."""
import subprocess
import sys
import textwrap

import pytest

from gh200rt.backends.cpu.host_allocator import _glibc

PROBE = textwrap.dedent("""
    import ctypes, torch
    {setup}
    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                     "keepcost")]
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    block = torch.empty(BLOCK // 4, dtype=torch.float32)
    mapped = libc.mallinfo2().hblkhd
    del block
    print(mapped, libc.mallinfo2().arena)
""")
# 100 MB: above the 32 MB that glibc's dynamic mmap threshold can grow to, so by default it is
# always a mapping of its own, unmapped (and faulted in anew next time) when freed.
BLOCK = 100 << 20

pytestmark = pytest.mark.skipif(_glibc() is None or not hasattr(_glibc(), "mallinfo2"),
                                reason="the thresholds are glibc's (mallinfo2: glibc >= 2.33)")


def _probe(setup: str) -> tuple[int, int]:
    code = PROBE.replace("BLOCK", str(BLOCK)).format(setup=setup)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    mapped, heap_after_free = map(int, out.stdout.split())
    return mapped, heap_after_free


def test_glibc_defaults_map_and_unmap_a_large_block():
    mapped, heap_after_free = _probe("")
    assert mapped >= BLOCK and heap_after_free < BLOCK          # the behaviour the engine's setting changes


def test_keep_freed_memory_keeps_the_block_in_the_heap():
    mapped, heap_after_free = _probe("from gh200rt.backends.cpu.host_allocator import keep_freed_memory; "
                                     "assert keep_freed_memory()")
    assert mapped < BLOCK and heap_after_free >= BLOCK


def test_a_cpu_engine_applies_it():
    setup = ("from gh200rt.config import EngineConfig; from gh200rt.engine.engine import LLMEngine; "
             "from tests.engine.toy_model import ToyArch, ToyModel, ToyTokenizer; arch = ToyArch(); "
             "LLMEngine(ToyModel(arch), ToyTokenizer(), arch, EngineConfig.from_kwargs(num_kv_blocks=8, "
             "block_size=4, max_model_len=32))")
    mapped, heap_after_free = _probe(setup)
    assert mapped < BLOCK and heap_after_free >= BLOCK


def test_release_freed_memory_gives_the_kept_pages_back():
    code = textwrap.dedent("""
        import os, torch
        from gh200rt.backends.cpu.host_allocator import keep_freed_memory, release_freed_memory
        rss = lambda: int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        assert keep_freed_memory()
        block = torch.ones(BLOCK // 4, dtype=torch.float32)           # touched: resident
        del block
        kept = rss()
        assert release_freed_memory()
        print(kept - rss())
    """).replace("BLOCK", str(BLOCK))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout) >= BLOCK * 0.9, f"released {int(out.stdout) / 2**20:.1f} MiB of {BLOCK / 2**20:.0f}"
