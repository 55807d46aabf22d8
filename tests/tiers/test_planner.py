import pytest

from gh200rt.config import MemoryConfig
from gh200rt.models.arch_config import ArchConfig
from gh200rt.plan import main as plan_main
from gh200rt.planner.cost_model import model_sizes
from gh200rt.planner.planner import PlanDoesNotFit, make_plan, spread_evenly
from gh200rt.platform.detect import detect

ARCH = ArchConfig("llama", hidden_size=64, intermediate_size=128, num_layers=6, num_heads=4,
                  num_kv_heads=2, head_dim=16, vocab_size=100)
SIZES = model_sizes(ARCH, "fp32")
CPU = detect("cpu")
FIXTURE = "tests/fixtures/llama31_70b"


def _budget_all_resident_plus(extra: int) -> int:
    return SIZES.fixed_bytes + 6 * SIZES.layer_bytes + extra


def test_all_resident_when_it_fits():
    plan = make_plan(SIZES, CPU, MemoryConfig(), _budget_all_resident_plus(1 << 20))
    assert plan.tiers == ("resident",) * 6 and plan.staging_slots == 0


def test_small_budget_streams_layers_and_leaves_more_kv():
    block = SIZES.kv_bytes_per_token * 16
    budget = _budget_all_resident_plus(block)  # all-resident leaves exactly 1 block
    memory = MemoryConfig(kv_cache_min_tokens=16 * 4)
    plan = make_plan(SIZES, CPU, memory, budget)
    assert plan.tiers.count("streamed") >= 1
    weights = plan.resident_weight_bytes + plan.staging_bytes
    assert weights + plan.kv_bytes <= budget and plan.num_kv_blocks > 1 and plan.kv_tokens >= 64
    assert plan.all_resident_kv_tokens == 16 < plan.kv_tokens  # all-resident leaves exactly one block


def test_budget_too_small_names_minimum():
    with pytest.raises(PlanDoesNotFit, match="smallest plan") as info:
        make_plan(SIZES, CPU, MemoryConfig(), SIZES.fixed_bytes)
    minimum = SIZES.fixed_bytes + SIZES.host_layer_bytes + SIZES.kv_bytes_per_token * 16
    assert str(minimum) in str(info.value)
    make_plan(SIZES, CPU, MemoryConfig(offload="stream", staging_slots=1), minimum)  # and it does work


def test_spread_evenly_and_overrides():
    assert spread_evenly(80, 4) == [10, 30, 50, 70]
    plan = make_plan(SIZES, CPU, MemoryConfig(offload="none", layer_tiers="1:direct,3-4:streamed",
                                              staging_slots=2, prefetch_distance=1), 1 << 30)
    assert plan.tiers == ("resident", "direct", "resident", "streamed", "streamed", "resident")
    assert [plan.slot_of(i) for i in (3, 4, 0)] == [0, 1, None]


@pytest.mark.parametrize("platform", ["gh200-96g", "h100-sxm"])
def test_plan_cli_on_70b_config(platform, capsys):
    assert plan_main(["--model", FIXTURE, "--platform", platform, "--kv-cache-min-tokens", "100000"]) == 0
    out = capsys.readouterr().out
    assert "streamed" in out and "resident" in out and "tokens" in out and "predicted decode step" in out
    assert out.count("\n") > 80  # one row per layer


def test_plan_cli_bad_budget_is_a_clear_error(capsys):
    assert plan_main(["--model", FIXTURE, "--platform", "h100-sxm", "--device-memory-budget", "1GiB"]) == 2
    assert "--device-memory-budget" in capsys.readouterr().err
