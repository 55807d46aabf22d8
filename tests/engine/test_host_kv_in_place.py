"""Host KV blocks read in place (``--kv-offloading-reads``): a prefix found in the host tier is named by the request's
table and read there by attention instead of being copied into device blocks. On the CPU platform the native
kernels (the one-call layer and stack included) and the torch attention read them; every CPU route:
tests/engine/test_host_kv_tier.py; the kernels' reads: tests/kernels/test_host_block_attention.py.
The tokens and logprobs are a load's, the blocks take no device block, stay pinned while read and are let go after;
what cannot read in place is refused (or, asked ``auto``, loads)."""
import pytest
import torch

from gh200rt.config import EngineConfig
from gh200rt.engine.host_kv_tier import host_reads
from gh200rt.kv.kv_manager import KVCacheManager
from gh200rt.sampling_params import SamplingParams
from gh200rt.serve.metrics import host_tier_lines
from tests.engine.real_models import SharedModel, save_tiny_llama
from tests.engine.test_host_kv_tier import conversations, synchronous_stores, talk


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return SharedModel(save_tiny_llama(str(tmp_path_factory.mktemp("tiny"))))


def tier_llm(tiny, reads: str, **options):
    options = {"num_kv_blocks": 8, "max_model_len": 96, "cpu_kernels": "torch", **options}
    llm = tiny.llm(kv_offloading_size="8MiB", kv_offloading_reads=reads, **options)
    synchronous_stores(llm)
    return llm


def pins(llm) -> int:
    return sum(block.pins for block in llm.engine.host_tier.index.blocks.values())


@pytest.mark.parametrize("kernels", ["torch", "native"])
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_hits_read_in_place_give_a_loads_bits(tiny, kv_cache_dtype, kernels):
    firsts = conversations(256, count=3, system=0)     # 9 prompt blocks: the pool's 8 cannot keep them all
    options = dict(kv_cache_dtype=kv_cache_dtype, cpu_kernels=kernels)
    want = talk(tier_llm(tiny, "load", **options), firsts, turns=2, max_tokens=2)
    llm = tier_llm(tiny, "in_place", **options)
    got = talk(llm, firsts, turns=2, max_tokens=2)
    host = llm.engine.stats().kv_host
    assert got == want
    assert host.read_in_place_blocks >= 3 and host.loaded_blocks == 0, host
    assert f"gh200rt_kv_host_read_in_place_blocks_total {host.read_in_place_blocks}" in "\n".join(
        host_tier_lines(host))
    assert pins(llm) == 0, "a finished request still holds host blocks"
    assert llm.engine.kv.pool.num_free == llm.engine.kv.pool.num_blocks


def test_a_request_reading_in_place_takes_only_the_device_blocks_it_computes(tiny):
    firsts = conversations(256, count=3, system=0)
    llm = tier_llm(tiny, "in_place")
    talk(llm, firsts, turns=1)                  # the three conversations' prompts reach the host tier
    engine = llm.engine
    prompt = firsts[0] + [7] * 20               # 72 tokens: 48 of them a host hit (3 blocks), 24 to compute
    engine.add_request("read", None, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True),
                       prompt_token_ids=prompt)
    engine.step()
    running = engine.requests["read"].seqs[0]
    first_host = engine.kv.pool.num_blocks
    on_host = [b for b in running.block_ids if b >= first_host]
    assert len(on_host) == 3 and running.block_ids[:3] == on_host, running.block_ids
    assert len(running.block_ids) - 3 == engine.kv.pool.num_blocks - engine.kv.pool.num_free
    assert pins(llm) == 3
    while engine.has_unfinished_requests():
        engine.step()
    assert pins(llm) == 0


def test_auto_reads_in_place_only_where_a_load_would_not_fit():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    kv.host_reads = "auto"

    class Seq:
        block_ids, all_token_ids = [], list(range(30))      # 8 blocks if the hit were loaded

    assert not kv.reads_in_place(Seq())
    assert kv.reads_in_place(Seq(), prompt_only=True)
    kv.pool.allocate(3)                                       # 7 free: the load would not fit
    assert kv.reads_in_place(Seq())
    kv.host_reads = "load"
    assert not kv.reads_in_place(Seq())


def test_what_cannot_read_in_place_is_refused_and_auto_loads(tiny, tmp_path):
    llm = tiny.llm(num_kv_blocks=8, max_model_len=128, kv_offloading_size="8MiB")   # auto, the native kernels
    assert llm.engine.kv.host_reads == "in_place" and llm.engine.runner.host_kv is not None   # the CPU: no link
    config = EngineConfig.from_kwargs(kv_offloading_size="8MiB", kv_offloading_reads="auto")
    assert host_reads(config, [torch.zeros(2, 4, 16, 1, 8)], "cpu") == "in_place"
    assert host_reads(config, [torch.zeros(2, 4, 16, 1, 8)], "cuda") == "auto"
    draft = {"method": "draft_model", "model": str(tmp_path), "num_speculative_tokens": 2}
    config = EngineConfig.from_kwargs(kv_offloading_size="8MiB", speculative_config=draft)
    assert host_reads(config, [torch.zeros(2, 4, 16, 1, 8)], "cpu") == "load"     # a draft with its own KV
    assert host_reads(config, [torch.zeros(2, 4, 16, 1, 8)], "cuda") == "load"


@pytest.mark.parametrize("options, message", [
    (dict(kv_offloading_reads="in_place", kv_offloading_size="4",
          speculative_config={"method": "draft_model", "model": "/tmp/draft", "num_speculative_tokens": 2}),
     "in_place with the draft_model method is not supported yet"),
    (dict(kv_offloading_reads="in_place"), "add --kv-offloading-size"),
    (dict(kv_offloading_reads="sometimes", kv_offloading_size="4"), "choose one of auto, load, in_place"),
])
def test_reads_that_cannot_be_honoured_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig.from_kwargs(**options)


@pytest.mark.parametrize("kernels", ["torch", "native"])
def test_ngram_drafts_verified_over_blocks_read_in_place_give_a_loads_tokens(tiny, kernels):
    """Verification steps (a decode row per drafted position) read the host blocks as plain decodes do."""
    firsts = conversations(256, count=3, system=0)
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
    seen = {}
    for reads in ("load", "in_place"):
        llm = tier_llm(tiny, reads, speculative_config=spec, cpu_kernels=kernels)
        seen[reads] = talk(llm, firsts, turns=2, max_tokens=6)
    assert llm.engine.stats().kv_host.read_in_place_blocks >= 3
    assert llm.engine.speculator.stats.num_drafts > 0, "no step verified a draft"
    assert seen["in_place"] == seen["load"]


@pytest.mark.interpreter
def test_the_gpu_kernels_read_in_place_what_they_would_load(tiny):
    """The engine's attention through the CUDA platform's (interpreted on CPU tensors; the other ops stay torch's):
    decodes and short prompt chunks in the Triton paged attention, chunks past its 16 queries in the torch attention,
    each reading the host blocks in place."""
    from gh200rt.backends.cuda.ops import triton_paged_attention
    from gh200rt.backends.interface import TORCH_OPS, switch_hooks
    firsts = conversations(256, count=3, system=0)
    seen = {}
    for reads in ("load", "in_place"):
        llm = tier_llm(tiny, reads)
        switch_hooks(llm.engine.runner.model, dict(TORCH_OPS, attention=triton_paged_attention))
        seen[reads] = talk(llm, firsts, turns=2, max_tokens=2)
    assert llm.engine.stats().kv_host.read_in_place_blocks >= 3
    assert seen["in_place"] == seen["load"]
