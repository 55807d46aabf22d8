"""MoE models under tensor parallelism on the CPU (gloo, two ranks): each routed expert's and the shared expert's
intermediate dimension split, the router replicated. TP=2 greedy tokens equal TP=1's in float32 for tiny Qwen3-MoE,
Qwen2-MoE (shared expert, a dense layer), Mixtral, DeepSeek-V3 (latent attention split by heads) and GLM-4.5, with
experts resident, direct, streamed and on the cpu tier; every rank routes
the same tokens to the same experts; with dynamic tiers, rank 0's expert moves are made by every rank."""
from __future__ import annotations

import random

import pytest

from gh200rt.distributed.launch import usable_cores
from gh200rt.sampling_params import SamplingParams
from gh200rt.weights.store import NoFreeRun
from gh200rt.weights.tiers import Tier
from tests.distributed.test_offload_tp import assert_no_run_or_slab_lost
from tests.distributed.tiny_tp_models import tp_llm
from tests.engine.real_models import assert_same_or_near_tie
from tests.model.tiny_checkpoints import save_tiny

pytestmark = pytest.mark.skipif(usable_cores() < 2, reason="two ranks need two CPU cores")
PROMPTS = [[5, 9, 33, 71, 100, 4], list(range(7, 40)), [200, 3, 17]]
GREEDY = SamplingParams(temperature=0, max_tokens=8, logprobs=2)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    paths = {}
    for family in ("qwen3-moe-norm", "qwen2-moe-shared", "mixtral", "deepseek-v3", "glm4-moe-qk-norm"):
        path = str(tmp_path_factory.mktemp(family))
        save_tiny(family, path)
        single = tp_llm(path, 1)
        paths[family] = path, single.generate(PROMPTS, GREEDY)
        single.engine.close()
    return paths


@pytest.mark.parametrize("family,experts", [
    ("qwen3-moe-norm", "resident"),
    ("qwen2-moe-shared", "resident"),
    ("mixtral", "resident"),
    ("qwen2-moe-shared", "direct"),
    ("mixtral", "stream"),
    ("deepseek-v3", "stream"),          # latent attention split by heads, the latent row whole on each rank
    ("glm4-moe-qk-norm", "resident"),   # DeepSeek-V3's MoE blocks (shared_experts) under GQA with partial RoPE
    ("qwen2-moe-shared", "cpu"),        # each rank's half of every expert on its own pool of host threads
])
def test_sharded_experts_give_tp1_tokens(checkpoints, family, experts):
    path, reference = checkpoints[family]
    llm = tp_llm(path, 2, moe_expert_tier=experts)
    engine = llm.engine
    try:
        model = engine.runner.model
        moe = next(layer.mlp for layer in model.layers if layer.sparse)
        assert moe.experts[0].down_proj.weight_ref.current.shape[-1] == 16          # 32 columns, half each
        if moe.shared_expert is not None:        # half of its columns (Qwen2-MoE's 48, DeepSeek's and GLM's 32)
            assert moe.shared_expert.down_proj.weight_ref.current.shape[-1] == \
                model.shard.arch.shared_expert_intermediate_size // 2
        if model.arch.is_mla:                    # 2 of 4 heads: their query and value rows, the latent whole
            attn = model.layers[0].self_attn
            assert attn.num_heads == 2 and attn.kv_b_proj.weight_ref.shape == (2 * (32 + 24), 32)
            assert attn.kv_a_proj_with_mqa.weight_ref.shape == (32 + 16, 64)
        want = {"resident": Tier.RESIDENT, "direct": Tier.DIRECT, "stream": Tier.STREAMED, "cpu": Tier.CPU}[experts]
        assert {t for tiers in engine.store.expert_tiers.values() for t in tiers} == {want}
        assert_same_or_near_tie(reference, llm.generate(PROMPTS, GREEDY), f"TP=2 {family}, experts {experts}")
        counts = {layer: c.tolist() for layer, c in engine.runner.model.routing_counts().items()}
        engine.close()
        final = engine.parallel.final_reports[1]
        assert {layer: c for layer, c in final["routing_counts"]} == counts     # the same routing on every rank
    finally:
        engine.close()


class ExpertFlips:
    """Stands in for the expert balancer: moves a random routed expert to a random tier every step (rank 0's
    decision; the workers repeat it)."""

    def __init__(self, store, seed: int):
        self.store, self.rng, self.moves = store, random.Random(seed), 0

    def between_steps(self, before_swaps=None):
        if before_swaps is not None:
            before_swaps()
        layer = self.rng.choice(sorted(self.store.expert_tiers))
        expert = self.rng.randrange(len(self.store.expert_tiers[layer]))
        try:
            self.store.set_expert_tier(layer, expert, self.rng.choice([Tier.RESIDENT, Tier.DIRECT, Tier.STREAMED]))
            self.moves += 1
        except NoFreeRun:
            pass
        return []


def test_expert_moves_under_dynamic_tiers_are_made_on_every_rank(checkpoints):
    path, _ = checkpoints["qwen3-moe-norm"]
    prompts = [list(range(10, 30)) + [50 + i] for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=2)
    single = tp_llm(path, 1)
    reference = single.generate(prompts, params)
    single.engine.close()
    llm = tp_llm(path, 2, offload="dynamic", device_memory_budget=16 << 20)
    engine = llm.engine
    try:
        assert engine.plan.dynamic and engine.balancer is not None and engine.store.expert_run_blocks
        engine.balancer = ExpertFlips(engine.store, seed=2)
        assert_same_or_near_tie(reference, llm.generate(prompts, params), "TP=2 Qwen3-MoE, experts moving")
        assert engine.balancer.moves >= 8
        assert_no_run_or_slab_lost(engine, layers=4)
        assert engine.parallel.final_reports[1]["expert_slabs"] == [0, 1, 2, 3]
    finally:
        engine.close()
