"""MoE models through the engine's placements (DESIGN invariant 4): an MoE layer's router, experts and shared
expert are part of its WeightRefs, so a streamed MoE layer streams all its experts and a direct one reads them
in place; every placement generates exactly what all-resident generates in float32 (staging slots poisoned
before every copy), and every CPU route runs MoE layers resident, streamed and direct."""
import pytest

from gh200rt.models.layers.cpu_prepack import linear_formats
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
    stats = eng.stats()
    if stats.layers_per_tier["streamed"]:
        assert stats.weight_bytes_copied > 0
    sparse = eng.store.slabs[0]       # layer 0 is sparse and offloaded in every placement here
    refs = eng.runner.model.layer_weight_refs(0)
    assert {"mlp.gate", "mlp.experts.7.gate_up_proj", "mlp.experts.7.down_proj", "mlp.shared_expert_gate"} <= set(refs)
    assert sparse.nbytes == eng.plan.sizes.host_layer_bytes     # the planner sized the slab of every expert
    eng.close()


def test_streamed_moe_layer_copies_every_expert(moe_dir):
    eng = engine(moe_dir, offload="none", layer_tiers="2:streamed", staging_slots=1, prefetch_distance=0)
    refs = eng.runner.model.layer_weight_refs(2)
    slot = eng.store.backend.slots[0]
    start, end = slot.data_ptr(), slot.data_ptr() + slot.nbytes
    assert all(start <= ref.current.data_ptr() < end for ref in refs.values())   # every expert points into the slot
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
