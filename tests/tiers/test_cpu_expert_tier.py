"""The cpu expert tier (weights/expert_cpu.py): routed experts kept in host memory and computed by a pool of host
threads while the "device" computes the layer's other experts and its shared expert. On the CPU platform the two
share the cores, so the mechanism runs here exactly: every placement that puts experts on the cpu tier (--cpu-moe,
--n-cpu-moe, --moe-expert-tier cpu, --layer-tiers L:experts=cpu, beside streamed and direct experts and layers), a
per-step choice forced at random between the host and the device, and random moves into and out of the tier between
steps generate all-resident's tokens and logprobs in float32, on the pool's thread."""
import random

import pytest

from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.planner.layout import expert_tiers_for
from gh200rt.sampling_params import SamplingParams
from gh200rt.serve.metrics import _engine_lines
from gh200rt.weights.tiers import Tier
from tests.engine.real_models import save_tiny_llama
from tests.model.tiny_checkpoints import save_tiny
from tests.tiers.test_engine_placement import engine, run
from tests.tiers.test_moe_placement import moe_dir, reference  # noqa: F401  (fixtures: Qwen2-MoE, all resident)

CPU_PLACEMENTS = {
    "--cpu-moe": dict(offload="none", cpu_moe=True),
    "--moe-expert-tier cpu, layers streamed": dict(offload="stream", moe_expert_tier="cpu", staging_slots=2,
                                                   prefetch_distance=1),
    "--n-cpu-moe 3": dict(offload="none", n_cpu_moe=3),                    # layers 0 and 2 (1 is dense), not 3
    "cpu beside streamed and direct experts": dict(offload="none", staging_slots=1, prefetch_distance=0,
                                                   layer_tiers="0:experts=cpu,2:experts=streamed,3:experts=direct"),
}


@pytest.mark.parametrize("label", CPU_PLACEMENTS)
def test_cpu_tier_placements_give_all_residents_bits(moe_dir, reference, label):
    eng = engine(moe_dir, **CPU_PLACEMENTS[label])
    try:
        assert run(eng) == reference, label
        stats, store = eng.stats(), eng.store
        cpu_layers = [layer for layer, tiers in store.expert_tiers.items() if Tier.CPU in tiers]
        assert cpu_layers == {"--n-cpu-moe 3": [0, 2], "cpu beside streamed and direct experts": [0]}.get(
            label, [0, 2, 3])
        assert stats.experts_per_tier["cpu"] == 8 * len(cpu_layers)
        # on the CPU platform every cpu-tier expert runs on the host's pool, however many tokens it has
        assert stats.cpu_expert_tier["runs"]["cpu"] > 0 and stats.cpu_expert_tier["runs"]["device"] == 0
        assert stats.cpu_expert_tier["pairs"]["cpu"] >= stats.cpu_expert_tier["runs"]["cpu"]
        worker = store.cpu_expert_pool._executor._threads
        assert worker and all(t.name.startswith("gh200rt-cpu-experts") for t in worker)
        assert eng.plan.expert_tiers == tuple(tuple(store.expert_tiers.get(i, ())) for i in range(4))
        assert f"{8 * len(cpu_layers)} cpu; host form" in eng.plan.explain()
    finally:
        eng.close()
    assert store.cpu_expert_pool.closed


def test_the_per_step_choice_changes_nothing_but_where(moe_dir, reference):
    """Every cpu-tier expert with tokens is sent to the host or the device at random in every step; between steps
    random experts move into and out of the cpu tier: all-resident's bits."""
    eng = engine(moe_dir, offload="none", moe_expert_tier="cpu", num_kv_blocks=32)
    store, rng = eng.store, random.Random(1)
    for access in store._stagings():
        access.choose_host = lambda expert, pairs: rng.random() < 0.5
    step = eng.step

    def moving_step():
        for _ in range(4):
            store.set_expert_tier(rng.choice([0, 2, 3]), rng.randrange(8),
                                  rng.choice(["resident", "direct", "cpu", "cpu"]))
        return step()
    eng.step = moving_step
    try:
        assert run(eng) == reference
        counts = eng.stats().cpu_expert_tier
        assert counts["runs"]["cpu"] > 0 and counts["runs"]["device"] > 0, counts
        assert store.expert_counts()["cpu"] and store.expert_counts()["resident"]
    finally:
        eng.close()


def test_max_tokens_sends_a_prefills_many_tokens_to_the_device(moe_dir, reference):
    """--moe-cpu-max-tokens 1: an expert with one pair in the step computes on the host, with more on the device."""
    eng = engine(moe_dir, offload="none", cpu_moe=True, moe_cpu_max_tokens=1)
    try:
        assert run(eng) == reference
        stats = eng.stats()
        counts = stats.cpu_expert_tier
        assert counts["runs"]["cpu"] == counts["pairs"]["cpu"] > 0
        assert counts["pairs"]["device"] > counts["runs"]["device"] > 0
        lines = _engine_lines(stats, 0)
        for kind in ("runs", "pairs"):
            name = "expert_runs" if kind == "runs" else "routed_tokens"
            for where in ("cpu", "device"):
                assert f'gh200rt_moe_cpu_tier_{name}_total{{where="{where}"}} {counts[kind][where]}' in lines
        assert 'gh200rt_moe_experts{tier="cpu"} 24' in lines
        assert not [line for line in lines if line.startswith('gh200rt_weight_layers{tier="cpu"')]
    finally:
        eng.close()


@pytest.mark.parametrize("family", ["qwen3-moe-norm", "mixtral", "deepseek-v3", "glm4-moe-qk-norm"])
def test_every_moe_family_computes_its_experts_on_the_cpu_tier(tmp_path, family):
    path = str(tmp_path / family)
    save_tiny(family, path)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=2)
    prompts = [[5, 9, 33, 71, 100, 4], [200, 3, 17]]
    want = engine(path, offload="none")
    reference = run(want, prompts, params)
    want.close()
    eng = engine(path, offload="none", cpu_moe=True)
    try:
        assert run(eng, prompts, params) == reference, family
        assert eng.stats().cpu_expert_tier["runs"]["cpu"] > 0
    finally:
        eng.close()


@pytest.mark.parametrize("host_format", ["int8", "int4", "int4-g128", "fp8", "bf16"])
def test_every_host_format_computes_on_the_pool_with_a_direct_experts_bits(moe_dir, host_format):
    """The pool multiplies the expert slab's own forms (quantized codes and scales, fp8, bf16) with the kernels a
    direct expert reads them with: the same bits, whatever the format."""
    def generate(tier):
        eng = engine(moe_dir, offload="none", moe_expert_tier=tier, host_weight_dtype=host_format)
        try:
            return run(eng), eng.stats().cpu_expert_tier
        finally:
            eng.close()
    (direct, _), (cpu, counts) = generate("direct"), generate("cpu")
    assert cpu == direct, host_format
    assert counts["runs"]["cpu"] > 0


def test_bad_cpu_tier_options_fail_at_start_with_what_to_do(moe_dir, tmp_path):
    tiny_dir = save_tiny_llama(str(tmp_path / "dense"), num_layers=2)
    with pytest.raises(ValueError, match="this model has none .a dense model.: drop the option"):
        engine(tiny_dir, cpu_moe=True)
    with pytest.raises(ValueError, match="this model has none"):
        engine(tiny_dir, layer_tiers="0:experts=cpu")
    with pytest.raises(ValueError, match=r"--moe-cpu-threads 100000: this process may use \d+ CPUs.*give at most"):
        engine(moe_dir, cpu_moe=True, moe_cpu_threads=100000)
    with pytest.raises(ValueError, match="--cpu-moe puts every routed expert on the cpu tier; drop it or "
                                         "--moe-expert-tier direct"):
        EngineConfig.from_kwargs(model=moe_dir, cpu_moe=True, moe_expert_tier="direct")
    with pytest.raises(ValueError, match="give it or --n-cpu-moe, not both"):
        EngineConfig.from_kwargs(model=moe_dir, cpu_moe=True, n_cpu_moe=2)
    with pytest.raises(ValueError, match="a layer's own weights are resident, streamed, direct; cpu places an MoE "
                                         "layer's routed experts"):
        EngineConfig.from_kwargs(model=moe_dir, layer_tiers="0:cpu")
    for flag, value in (("n_cpu_moe", -1), ("moe_cpu_threads", 0), ("moe_cpu_max_tokens", 0)):
        with pytest.raises(ValueError, match=f"--{flag.replace('_', '-')} must be"):
            EngineConfig.from_kwargs(model=moe_dir, **{flag: value})


def test_a_form_the_host_cannot_multiply_is_refused_at_start(moe_dir, monkeypatch):
    from gh200rt.weights.expert_cpu import HostExpertMLP

    def refuse(self, weights, rows, block_rows):
        raise NotImplementedError("no kernel for this form")
    monkeypatch.setattr(HostExpertMLP, "__call__", refuse)
    with pytest.raises(ValueError, match="the cpu expert tier cannot compute layer 0's routed experts in its host "
                                         "form.*no kernel for this form.*--moe-expert-tier direct / stream"):
        engine(moe_dir, cpu_moe=True)


def test_n_cpu_moe_counts_layers_not_moe_layers_and_layer_tiers_win(moe_dir):
    config = EngineConfig.from_kwargs(model=moe_dir, n_cpu_moe=2, layer_tiers="0:experts=direct")
    eng = LLMEngine.from_config(config)
    try:
        sizes, platform = eng.plan.sizes, eng.plan.platform
    finally:
        eng.close()
    tiers = expert_tiers_for(sizes, config.memory, platform, 1 << 40)
    assert [set(t) for t in tiers] == [{Tier.DIRECT}, set(), {Tier.RESIDENT}, {Tier.RESIDENT}]
