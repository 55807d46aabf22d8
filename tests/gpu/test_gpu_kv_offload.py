"""The host KV tier on a GPU: stores wait for the step that wrote a block (an event) and copy on their own stream
into pinned memory; loads are asynchronous and hold their host blocks until they have run; blocks come back bit
for bit, from the device arena's block-major view and from per-layer caches."""
import pytest
import torch

from gh200rt.kv.offload import KVOffloader, PoolBlocks

pytestmark = pytest.mark.gpu
ROOT = ("salt", 0)


@pytest.mark.parametrize("block_major", [True, False])
def test_a_block_goes_to_pinned_memory_and_back_bit_for_bit(block_major):
    arena = torch.randn(8, 3, 2, 16, 2, 64, device="cuda", dtype=torch.bfloat16)
    caches = [arena[:, layer].transpose(0, 1) for layer in range(3)]
    offload = KVOffloader(PoolBlocks(caches, arena if block_major else None), 4, pin_memory=True)
    try:
        assert offload.host.is_pinned()
        arena[2].fill_(3.0)                       # the "step" writes the block; the store is ordered after it
        want = arena[2].clone()
        offload.store(2, 10, tuple(range(16)), ROOT)
        offload.wait_for_stores()
        [block] = offload.index.lookup_chain([(10, tuple(range(16)))], ROOT)
        arena[6].zero_()
        offload.load([(block, 6)])
        assert block.pins == 1                    # held until the asynchronous copy has run
        torch.cuda.synchronize()
        assert torch.equal(arena[6], want)
        [again] = offload.index.lookup_chain([(10, tuple(range(16)))], ROOT)
        offload.load([(again, 7)])                # the next load lets go of the finished one's hold first
        torch.cuda.synchronize()
        assert block.pins == 1 and torch.equal(arena[7], want)
    finally:
        offload.close()
