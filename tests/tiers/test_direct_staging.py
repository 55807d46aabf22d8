"""Long steps stage DIRECT layers through the staging ring (host_gemm would reread each weight over the
link once per 64 rows): the cost model's threshold, the plan that books slots for it, and the engine,
run for real on the CPU with the threshold forced low, generating exactly what all-resident does."""
import pytest

from gh200rt.config import MemoryConfig
from gh200rt.planner import cost_model, layout
from gh200rt.planner.cost_model import HOST_GEMM_ROWS_PER_READ, direct_staging_min_tokens, model_sizes
from gh200rt.planner.planner import make_plan
from gh200rt.platform.detect import Platform
from gh200rt.platform.profiles import get_profile
from tests.tiers.test_engine_placement import PROMPTS, engine, run


def platform(name: str) -> Platform:
    return Platform.from_profile(get_profile(name))


def test_threshold_is_where_rereads_cost_more_than_one_copy():
    assert direct_staging_min_tokens(platform("cpu")) is None
    for name in ("gh200-96g", "h100-sxm", "h100-pcie"):
        assert direct_staging_min_tokens(platform(name)) == HOST_GEMM_ROWS_PER_READ + 1, name
    slow_copy = Platform.from_profile(get_profile("h100-sxm"))
    import dataclasses
    slow_copy = dataclasses.replace(slow_copy, link_h2d_gbps=10.0, direct_read_gbps=35.0)  # 3 reads beat a copy
    assert direct_staging_min_tokens(slow_copy) == 3 * HOST_GEMM_ROWS_PER_READ + 1


def test_host_gemm_tile_matches_the_cost_model():
    from gh200rt.kernels.triton.host_gemm import tile_config
    assert tile_config(4096)["BLOCK_M"] == HOST_GEMM_ROWS_PER_READ


def test_gpu_plans_book_slots_for_direct_layers():
    from gh200rt.models.arch_config import ArchConfig
    arch = ArchConfig("llama", hidden_size=256, intermediate_size=512, num_layers=4, num_heads=4, num_kv_heads=2,
                      head_dim=64, vocab_size=300)
    sizes = model_sizes(arch, "bf16")
    gpu = make_plan(sizes, platform("h100-sxm"), MemoryConfig(offload="direct"), 1 << 30)
    assert gpu.staging_slots == 2 and gpu.direct_staging_tokens == 65
    assert "staged through the ring in steps of >= 65 tokens" in gpu.explain()
    cpu = make_plan(sizes, platform("cpu"), MemoryConfig(offload="direct"), 1 << 30)
    assert cpu.staging_slots == 0 and cpu.direct_staging_tokens is None


@pytest.mark.parametrize("options", [dict(offload="direct"),
                                     dict(offload="direct", layer_tiers="1:streamed,4:streamed")],
                         ids=["direct", "direct + streamed"])
def test_staged_long_steps_generate_what_all_resident_generates(tiny_dir, monkeypatch, options):
    reference = run(engine(tiny_dir, offload="none"))
    monkeypatch.setattr(layout, "direct_staging_min_tokens", lambda platform: 8)  # prompts of 8+ tokens stage
    eng = engine(tiny_dir, staging_slots=2, prefetch_distance=1, **options)
    schedule = eng.store._schedule
    assert eng.plan.direct_staging_tokens == 8 and schedule.large_step_tokens == 8
    assert len(schedule.large_order) > len(schedule.decode_order)
    assert run(eng) == reference       # a 30-token prompt stages, decode steps read in place; slots are poisoned
    assert eng.stats().weight_bytes_copied > 0
    assert schedule.order is schedule.decode_order
    eng.close()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from tests.engine.real_models import save_tiny_llama
    return save_tiny_llama(str(tmp_path_factory.mktemp("tiny6-staging")), num_layers=6)


def test_prompts_used_here_cover_both_orders():
    assert min(map(len, PROMPTS)) < 8 <= max(map(len, PROMPTS))
    assert cost_model.HOST_GEMM_ROWS_PER_READ == 64


def test_order_switches_keep_the_graphs_addresses_and_the_slot_bindings(tiny_dir, monkeypatch):
    """A float32 model with bf16 host weights binds a streamed layer as UpcastWeight(slot view); prompt steps
    switch to the large order and decode steps back, between replays of the decode graphs. The address check
    must see the same storage (not a new wrapper object) and the store must hand out the same bindings."""
    monkeypatch.setattr(layout, "direct_staging_min_tokens", lambda platform: 8)
    eng = engine(tiny_dir, staging_slots=2, prefetch_distance=1, offload="direct", layer_tiers="0-2:streamed",
                 host_weight_dtype="bf16", enforce_eager=False, check_graph_addresses=True)
    ref = eng.runner.model.layer_weight_refs(0)["self_attn.qkv_proj"]
    assert type(ref.current).__name__ == "UpcastWeight", ref.current
    decode_binding = ref.current
    first = run(eng)                       # graphs captured; the 30-token prompt switched orders around them
    assert eng.graphs.captures > 0 and eng.store._schedule.large_order != eng.store._schedule.decode_order
    assert run(eng) == first               # second pass: replays after more switches, addresses checked
    assert ref.current is decode_binding, "a switch back to the decode order rebuilt the slot's weights"
    eng.close()
