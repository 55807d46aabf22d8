"""Streamed and direct layers per tensor-parallel rank on the CPU: with --offload stream / direct and --layer-tiers,
TP=2 greedy tokens equal TP=1's in float32, each rank's host slabs hold its shard (1/2 of the layers' linears) and
every rank places the same tiers; dynamic tiers are refused with a message naming what works."""
from __future__ import annotations

import pytest

from gh200rt.distributed.launch import usable_cores
from gh200rt.sampling_params import SamplingParams
from tests.distributed.tiny_tp_models import save_tp_tiny, tp_llm
from tests.engine.real_models import assert_same_or_near_tie

pytestmark = pytest.mark.skipif(usable_cores() < 2, reason="two ranks need two CPU cores")
PROMPTS = [[5, 9, 33, 71, 100, 4], list(range(7, 40))]
GREEDY = SamplingParams(temperature=0, max_tokens=10, logprobs=2)
# hidden 64, q 64, kv 2x32, intermediate 128, float32: one layer's qkv, o, gate_up and down
LAYER_BYTES = (128 * 64 + 64 * 64 + 256 * 64 + 64 * 128) * 4


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = save_tp_tiny("llama-gqa", str(tmp_path_factory.mktemp("llama-gqa")))
    single = tp_llm(path, 1)
    reference = single.generate(PROMPTS, GREEDY)
    single.engine.close()
    return path, reference


@pytest.mark.parametrize("options,tiers", [
    (dict(offload="stream"), ["streamed", "streamed"]),
    (dict(offload="direct"), ["direct", "direct"]),
    (dict(layer_tiers="0:streamed,1:direct"), ["streamed", "direct"]),
])
def test_offloaded_layers_per_rank_give_tp1_tokens(llama, options, tiers):
    path, reference = llama
    llm = tp_llm(path, 2, **options)
    try:
        assert_same_or_near_tie(reference, llm.generate(PROMPTS, GREEDY), f"TP=2 {options}")
        reports = llm.engine.parallel.reports
        for rank, report in reports.items():
            assert report["layer_tiers"] == tiers, (rank, report)
            assert report["host_slab_bytes"] == 2 * LAYER_BYTES // 2, (rank, report)   # 2 layers, 1/2 each
        assert llm.engine.plan.rank_share.world_size == 2
    finally:
        llm.engine.close()


def test_dynamic_tiers_are_refused_naming_what_works(llama):
    with pytest.raises(ValueError, match="--offload dynamic.*not supported with tensor parallelism.*--offload none"):
        tp_llm(llama[0], 2, offload="dynamic")
