"""The host KV tier on a GPU: stores wait for the step that wrote a block (an event) and copy on their own stream
into pinned memory; loads are asynchronous and hold their host blocks until they have run; blocks come back bit
for bit, from the device arena's block-major view and from per-layer caches; attention reads them in place over the
link with the bits it reads from device memory."""
import dataclasses

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


@pytest.mark.parametrize("block_major", [True, False])
@pytest.mark.parametrize("mapped", [True, False], ids=["gathered-by-layer", "whole-blocks"])
def test_a_layered_load_brings_each_layer_on_the_load_stream(block_major, mapped):
    """kv/layered_load.py on a GPU: every layer's copies queued on the load stream at once (one gather per layer from
    the tier as the device maps it; unmapped, whole blocks that every layer waits for), the compute stream waiting
    for each layer's event; the bytes are the stored block's, and its host block is held until the copies have
    run."""
    arena = torch.randn(8, 3, 2, 16, 2, 64, device="cuda", dtype=torch.bfloat16)
    caches = [arena[:, layer].transpose(0, 1) for layer in range(3)]
    offload = KVOffloader(PoolBlocks(caches, arena if block_major else None), 4, pin_memory=True)
    try:
        assert offload.device_tier is not None, "pinned memory is mapped for the device"
        if not mapped:
            offload.device_tier = None
        want = [arena[b].clone() for b in (2, 3)]
        offload.store(2, 10, tuple(range(16)), ROOT)
        offload.store(3, 11, tuple(range(16, 32)), ("hash", 10))
        offload.wait_for_stores()
        blocks = offload.index.lookup_chain([(10, tuple(range(16))), (11, tuple(range(16, 32)))], ROOT)
        arena[5:7].zero_()
        loads = offload.start_layered_load([(blocks[0], 6), (blocks[1], 5)])
        for layer in range(3):
            loads.ready(layer)
            got = arena[[6, 5], layer].clone()          # read on the compute stream after its wait
            assert torch.equal(got, torch.stack([w[layer] for w in want])), layer
        loads.finish()
        assert blocks[0].pins == 1 and offload.index.stats.loaded_blocks == 2
        torch.cuda.synchronize()
        assert torch.equal(arena[6], want[0]) and torch.equal(arena[5], want[1])
    finally:
        offload.close()


def on_gpu(meta):
    """A step's metadata with its tensors on the GPU."""
    return dataclasses.replace(meta, **{f.name: getattr(meta, f.name).cuda() for f in dataclasses.fields(meta)
                                        if torch.is_tensor(getattr(meta, f.name))})


def test_the_paged_attention_reads_pinned_host_blocks_in_place_bit_for_bit():
    """Table entries naming host blocks, read by the compiled kernels over the link (a CUDA view of pinned memory,
    no copy): the bits of the same blocks in device memory, single-pass and split."""
    from gh200rt.kernels.triton.paged_attention import paged_attention
    from gh200rt.kernels.triton.store_kv import reference_write_kv
    from gh200rt.kv.host_blocks import HostBlocksView, device_visible
    from tests.kernels.test_host_block_attention import MOVES, QUERY_LENS, SEQ_LENS, move_to_host
    from tests.kernels.test_paged_attention import build_case
    from tests.kernels.test_split_attention import padded
    # the case is built on the CPU, where the compiled store cannot write: its torch reference writes the same bits
    q, pool, meta = build_case(QUERY_LENS, SEQ_LENS, 8, 2, 128, 16, torch.bfloat16, seed=3, store=reference_write_kv)
    meta = padded(meta, meta.block_tables.shape[1] + 2)
    host_meta, host, poisoned = move_to_host(pool, meta, MOVES["every other"])
    tier = host.pool.transpose(0, 1).contiguous().pin_memory()        # [slots, 2, ...] as the tier holds a layer
    on_device = HostBlocksView(device_visible(tier, torch.device("cuda")).transpose(0, 1), host.first_id)
    assert on_device.pool.is_cuda and on_device.pool.data_ptr() != 0
    for splits in (1, 3):
        want = paged_attention(q.cuda(), pool.cuda(), on_gpu(meta), 128 ** -0.5, 2, num_splits=splits)
        got = paged_attention(q.cuda(), poisoned.cuda(), on_gpu(host_meta), 128 ** -0.5, 2, num_splits=splits,
                              host=on_device)
        assert torch.equal(got, want), splits


def test_an_engine_reading_host_blocks_in_place_generates_what_loading_them_generates(tmp_path):
    """CUDA graphs captured with the host tier's view, eager prompt chunks (Triton and torch attention): the tokens
    and logprobs of loads, with no load made."""
    from gh200rt.config import EngineConfig
    from gh200rt.engine.engine import LLMEngine
    from gh200rt.engine.llm import LLM
    from tests.engine.real_models import save_tiny_llama
    from tests.engine.test_host_kv_tier import conversations, talk
    model = save_tiny_llama(str(tmp_path / "tiny"))
    firsts = conversations(256, count=3, system=0)
    seen = {}
    for reads in ("load", "in_place"):
        config = EngineConfig.from_kwargs(model=model, dtype="bfloat16", max_model_len=96, num_kv_blocks=8,
                                          kv_offloading_size="8MiB", kv_offloading_reads=reads)
        llm = LLM.from_engine(LLMEngine.from_config(config))
        seen[reads] = talk(llm, firsts, turns=2, max_tokens=4)
        host = llm.engine.stats().kv_host
        llm.engine.close()
    assert host.read_in_place_blocks >= 3 and host.loaded_blocks == 0, host
    assert seen["in_place"] == seen["load"]


def test_the_latent_kernel_reads_pinned_host_blocks_in_place_bit_for_bit():
    from gh200rt.kernels.triton.mla_attention import mla_attention
    from gh200rt.kv.host_blocks import HostBlocksView, device_visible
    from tests.kernels.paged_cases import scattered_case
    from tests.kernels.test_host_block_attention import MOVES, move_to_host
    q, pool, meta, _ = scattered_case([1, 1, 4], [3, 45, 33], 128, 1, 576, 16, torch.bfloat16, seed=2)
    plane = pool[:1]
    host_meta, host, poisoned = move_to_host(plane, meta, MOVES["every other"])
    tier = host.pool.transpose(0, 1).contiguous().pin_memory()
    on_device = HostBlocksView(device_visible(tier, torch.device("cuda")).transpose(0, 1), host.first_id)
    for splits in (1, 3):
        want = mla_attention(q.cuda(), plane[0].cuda(), on_gpu(meta), 576 ** -0.5, num_splits=splits)
        got = mla_attention(q.cuda(), poisoned[0].cuda(), on_gpu(host_meta), 576 ** -0.5, num_splits=splits,
                            host=on_device)
        assert torch.equal(got, want), splits
