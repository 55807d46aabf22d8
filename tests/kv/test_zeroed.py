"""KV pools start as zeros without writing their pages at allocation on the CPU (memory/zeroed.py)."""
import pytest
import torch

from gh200rt.backends.cpu.host_allocator import keep_freed_memory, release_freed_memory
from gh200rt.kv.arena import DeviceArena
from gh200rt.kv.pool import allocate_kv_caches
from gh200rt.memory.zeroed import PAGE, zeroed


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.uint8], ids=str)
def test_zeroed_is_torch_zeros_on_a_page(dtype):
    got = zeroed((3, 5, 7), dtype)
    assert got.shape == (3, 5, 7) and got.dtype == dtype and got.is_contiguous()
    assert got.data_ptr() % PAGE == 0
    assert torch.equal(got.view(torch.uint8), torch.zeros(3, 5, 7 * dtype.itemsize, dtype=torch.uint8))
    got.view(torch.uint8).fill_(1)       # writable, and its own memory
    assert zeroed((3, 5, 7), dtype).view(torch.uint8).sum() == 0
    assert zeroed((0, 4), dtype).shape == (0, 4)


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/statm"), reason="reads Linux's /proc")
def test_a_large_pool_costs_only_the_pages_it_uses():
    before = resident_bytes()
    arena = DeviceArena(8192, 4, 16, 2, 64, torch.bfloat16)      # 32 KiB blocks: 256 MiB
    caches = allocate_kv_caches(4, 8192, 16, 2, 64, torch.bfloat16)
    assert arena.nbytes == 256 << 20
    assert resident_bytes() - before < 64 << 20, "allocating the pools wrote their pages"
    assert arena.blocks()[7].abs().sum() == 0 and all(c[:, 9].abs().sum() == 0 for c in caches)
    arena.blocks()[3].fill_(1)
    assert arena.blocks()[3].sum() == arena.blocks()[3].numel() and arena.blocks()[4].abs().sum() == 0


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/statm"), reason="reads Linux's /proc")
def test_pools_cost_nothing_after_an_engine_raised_the_malloc_thresholds():
    """An engine on the CPU keeps freed memory in the heap (host_allocator.py): calloc then serves allocations below
    its raised mmap threshold from the heap, and clears with memset what the heap has used before, which faults in
    the pages an idle server gave back (``release_freed_memory``). Pools must not go that way."""
    keep_freed_memory()                      # process-wide, as every CPU engine in this process sets it
    churn = [torch.ones(8 << 20, dtype=torch.uint8) for _ in range(12)]  # a step's activations, freed for reuse
    pinned = torch.ones(1 << 20, dtype=torch.uint8)   # above them in the heap: they cannot merge into its top
    del churn
    release_freed_memory()
    before = resident_bytes()
    caches = allocate_kv_caches(8, 1024, 16, 2, 64, torch.bfloat16)     # 8 MiB per layer, below the threshold
    assert resident_bytes() - before < 16 << 20, "allocating the pools wrote their pages"
    assert all(c.abs().sum() == 0 and c.data_ptr() % PAGE == 0 for c in caches)
    assert pinned.sum() == 1 << 20           # kept until here, holding the freed chunks below the heap's top
