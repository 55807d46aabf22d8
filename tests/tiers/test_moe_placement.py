"""MoE models through the engine's placements (DESIGN invariant 4). An MoE layer's attention, router and shared
expert follow the layer's tier; each routed expert has a tier of its own (--moe-expert-tier, --layer-tiers
L:experts=TIER): resident, direct (read in place) or streamed (copied into the expert ring only in the steps
that route to it). Every placement, and random expert moves between steps, generate exactly what
all-resident generates in float32 (staging slots poisoned before every copy); every CPU route runs MoE
layers and experts resident, streamed and direct."""
import random

import pytest

from gh200rt.backends.cpu.prepack import linear_formats
from gh200rt.sampling_params import SamplingParams
from tests.model.tiny_checkpoints import save_tiny
from tests.tiers.test_cpu_routes_engine import engine as route_engine
from tests.tiers.test_cpu_routes_engine import run as route_run
from tests.tiers.test_engine_placement import engine, run

PLACEMENTS = {
    "stream K1 d0": dict(offload="stream", staging_slots=1, prefetch_distance=0),
    "stream K2 d1": dict(offload="stream", staging_slots=2, prefetch_distance=1),
    "direct": dict(offload="direct"),
    "mixed tiers": dict(offload="none", layer_tiers="0:streamed,1:direct,3:streamed", staging_slots=2,
                        prefetch_distance=1),
    "resident layers, streamed experts": dict(offload="none", moe_expert_tier="stream"),
    "resident layers, direct experts": dict(offload="none", moe_expert_tier="direct"),
    "streamed layers, resident experts": dict(offload="stream", moe_expert_tier="resident", staging_slots=2,
                                              prefetch_distance=1),
    "experts per layer": dict(offload="none", layer_tiers="0:experts=streamed,2:experts=direct,3:streamed",
                              staging_slots=1, prefetch_distance=0),
}


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    """Qwen2-MoE: layers 0, 2, 3 sparse with a shared expert, layer 1 dense (mlp_only_layers)."""
    path = str(tmp_path_factory.mktemp("qwen2moe"))
    save_tiny("qwen2-moe-shared", path)
    return path


@pytest.fixture(scope="module")
def reference(moe_dir):
    eng = engine(moe_dir, offload="none")
    out = run(eng)
    eng.close()
    return out


@pytest.mark.parametrize("label", PLACEMENTS)
def test_moe_placements_are_bit_identical(moe_dir, reference, label):
    eng = engine(moe_dir, **PLACEMENTS[label])
    assert run(eng) == reference, label
    stats, store, sizes = eng.stats(), eng.store, eng.plan.sizes
    if stats.layers_per_tier["streamed"]:
        assert stats.weight_bytes_copied > 0
    if stats.experts_per_tier["streamed"]:
        assert 0 < stats.expert_bytes_copied
    assert sum(stats.experts_per_tier.values()) == 3 * 8
    assert [tuple(store.expert_tiers[i]) for i in (0, 2, 3)] == [eng.plan.expert_tiers[i] for i in (0, 2, 3)]
    # the planner sized every slab: a layer's (its largest kind: here the dense layer 1) and an MoE layer's experts
    assert max((slab.nbytes for slab in store.slabs.values()), default=0) <= sizes.host_layer_bytes
    for layer, slab in store.expert_slabs.items():
        assert slab.nbytes == 8 * sizes.host_expert_bytes and slab.expert_nbytes <= sizes.host_expert_bytes
    assert eng.ledger.by_kind["resident_weights"] <= eng.plan.resident_weight_bytes
    eng.close()


def test_a_streamed_moe_layer_leaves_its_experts_where_they_are(moe_dir):
    eng = engine(moe_dir, offload="none", layer_tiers="2:streamed", staging_slots=1, prefetch_distance=0)
    model, slot = eng.runner.model, eng.store.backend.slots[0]
    start, end = slot.data_ptr(), slot.data_ptr() + slot.nbytes
    layer_refs = eng.store._layer_refs(2)
    assert set(layer_refs) == {"self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate", "mlp.shared_expert.gate_up_proj",
                               "mlp.shared_expert.down_proj", "mlp.shared_expert_gate"}
    assert all(start <= ref.current.data_ptr() < end for ref in layer_refs.values())
    experts = [ref.current for refs in model.expert_weight_refs(2) for ref in refs.values()]
    assert not any(start <= w.data_ptr() < end for w in experts)    # resident: --offload none's experts
    eng.close()


def test_streamed_experts_are_copied_only_when_routed_to(moe_dir):
    """One prompt token and one decode step route to at most k=2 experts per layer: the ring copies those
    experts' spans and no more."""
    eng = engine(moe_dir, offload="none", moe_expert_tier="stream")
    span = eng.store.expert_slabs[0].expert_nbytes
    run(eng, prompts=[[7]], params=SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, logprobs=1))
    copied = eng.stats().expert_bytes_copied
    assert copied % span == 0 and 0 < copied // span <= 2 * 3 * 2, copied // span   # 2 steps x 3 MoE layers x k
    eng.close()


def test_random_expert_moves_between_steps_give_the_same_tokens(moe_dir, reference):
    """Every step, eight random experts move to a random tier; the tokens and logprobs stay those of all-resident
    (float32, poisoned slots), and the ledger gives back every byte a demotion frees."""
    eng = engine(moe_dir, offload="none", moe_expert_tier="direct", num_kv_blocks=32)   # room to promote experts
    store, rng = eng.store, random.Random(0)
    baseline = eng.ledger.by_kind["resident_weights"]
    step = eng.step

    def moving_step():
        for _ in range(8):
            store.set_expert_tier(rng.choice([0, 2, 3]), rng.randrange(8), rng.choice(["resident", "direct",
                                                                                      "streamed"]))
        return step()
    eng.step = moving_step
    assert run(eng) == reference
    moved = store.expert_counts()
    assert moved["resident"] and moved["streamed"], moved
    for layer, tiers in store.expert_tiers.items():
        for expert in range(8):
            store.set_expert_tier(layer, expert, "direct")
    assert eng.ledger.by_kind["resident_weights"] == baseline
    eng.close()


def test_every_cpu_route_runs_moe_layers_in_every_tier(moe_dir, cpu_route):
    resident = route_engine(moe_dir, offload="none", **cpu_route.options)
    assert resident.runner.model.dtype == cpu_route.dtype
    formats = linear_formats(resident.runner.model)
    assert sum(formats.values()) == 4 * 2 + 2 + 3 * (1 + 16 + 3) + 1, formats   # attention, mlps, router, lm_head
    tokens = route_run(resident)
    assert all(len(t) == 6 for t, _ in tokens)
    streamed = route_run(route_engine(moe_dir, offload="stream", staging_slots=2, prefetch_distance=1,
                                      **cpu_route.options))
    direct = route_run(route_engine(moe_dir, offload="direct", **cpu_route.options))
    assert streamed == direct, cpu_route.name        # the same host forms, read from a slot or in place
    resident.close()
