"""Planning an MoE model from its config.json alone (Qwen3-30B-A3B's and Qwen3-235B-A22B's real shapes, no
weights): routed experts are sized and placed one by one, apart from their layers."""
import json
import re

import pytest

from gh200rt.config import MemoryConfig
from gh200rt.models.arch_config import ArchConfig
from gh200rt.plan import main
from gh200rt.planner.budget import smallest_layout
from gh200rt.planner.cost_model import aligned_total, expected_distinct_experts, layer_linear_shapes, model_sizes
from gh200rt.planner.layout import layout_for, planning_sizes
from gh200rt.platform.detect import detect
from gh200rt.weights.tiers import Tier

QWEN3_30B = "tests/fixtures/qwen3_30b_a3b"
QWEN3_235B = "tests/fixtures/qwen3_235b_a22b"


def arch(path: str = QWEN3_30B) -> ArchConfig:
    with open(f"{path}/config.json") as f:
        return ArchConfig.from_hf_config(json.load(f))


def test_layer_and_expert_bytes():
    a = arch()
    assert (a.num_experts, a.num_experts_per_tok, a.moe_intermediate_size, a.norm_topk_prob) == (128, 8, 768, True)
    assert a.moe_layers == list(range(48)) and a.qk_norm and not a.attention_bias
    sizes = model_sizes(a, "bf16")
    attention = (4096 + 2 * 512) * 2048 + 2048 * 4096
    router = 128 * 2048
    assert sizes.layer_bytes == aligned_total([2 * n * k for n, k in layer_linear_shapes(a, "moe")])
    assert sizes.layer_bytes == 2 * (attention + router)      # a layer's tier: attention and router, no expert
    assert sizes.expert_bytes == sizes.host_expert_bytes == 2 * 3 * 2048 * 768
    assert (sizes.moe_layer_ids, sizes.num_experts, sizes.experts_per_tok) == (tuple(range(48)), 128, 8)
    total = sizes.fixed_bytes + 48 * sizes.layer_bytes + 48 * 128 * sizes.expert_bytes
    assert total == sizes.all_resident_bytes
    assert 30.0e9 < total / 2 < 31.0e9, total / 2   # Qwen3-30B-A3B: 30.5B parameters
    # a token multiplies its 8 experts only (3.3B active parameters)
    active = 48 * sizes.layer_params + 2 * 151936 * 2048
    assert 3.0e9 < active < 3.6e9, active
    fp8 = model_sizes(a, "bf16", host_format="fp8")
    assert fp8.host_expert_bytes == 3 * 2048 * 768 + 4 * (2 * 768 + 2048)   # a byte a weight, a scale a row


def test_expected_distinct_experts():
    assert expected_distinct_experts(128, 8, 1) == pytest.approx(8)
    assert expected_distinct_experts(128, 8, 8) == pytest.approx(128 * (1 - (120 / 128) ** 8))
    assert 127.9 < expected_distinct_experts(128, 8, 256) <= 128
    assert expected_distinct_experts(0, 0, 4) == 0


def plan_layout(path: str, platform: str, capacity: int, **memory):
    sizes = model_sizes(arch(path), "bf16", host_format=memory.pop("host_format", None))
    options = MemoryConfig(**memory)
    p = detect(platform)
    planned = planning_sizes(sizes, options, p, 16)
    return planned, layout_for(planned, p, options, capacity, 16, 0, 4096)


def test_auto_keeps_experts_resident_while_they_fit_then_splits_each_layer():
    sizes = model_sizes(arch(), "bf16")
    room = sizes.all_resident_bytes + (64 << 20)
    _, whole = plan_layout(QWEN3_30B, "gh200-96g", room, offload="none", moe_expert_tier="auto")
    assert {t for layer in whole.expert_tiers for t in layer} == {Tier.RESIDENT}
    planned, split = plan_layout(QWEN3_30B, "gh200-96g", 24 << 30, offload="auto", moe_expert_tier="auto")
    resident = [layer.count(Tier.RESIDENT) for layer in split.expert_tiers]
    assert len(set(resident)) == 1 and 0 < resident[0] < 128, resident     # the same split in every layer
    assert set(split.expert_tiers[0][resident[0]:]) == {Tier.DIRECT}       # C2C: read in place
    assert split.tiers.count(Tier.RESIDENT) == 48 and split.fits(24 << 30)
    # one more resident expert per layer would not fit
    assert split.weight_bytes + 48 * planned.resident_expert_memory + split.kv_min_bytes > 24 << 30
    _, pcie = plan_layout(QWEN3_30B, "h100-sxm", 24 << 30, offload="auto", moe_expert_tier="auto")
    assert Tier.STREAMED in pcie.expert_tiers[0] and Tier.DIRECT not in pcie.expert_tiers[0]  # a slow link: copy


def test_explicit_expert_tiers_and_overrides():
    _, layout = plan_layout(QWEN3_30B, "gh200-96g", 80 << 30, offload="none", moe_expert_tier="stream",
                            layer_tiers="0-3:experts=direct,5:streamed")
    assert set(layout.expert_tiers[0]) == {Tier.DIRECT} and set(layout.expert_tiers[4]) == {Tier.STREAMED}
    assert layout.tiers[5] == Tier.STREAMED and layout.tiers[4] == Tier.RESIDENT
    with pytest.raises(ValueError, match="layer 60 has no routed experts"):
        plan_layout(QWEN3_30B, "gh200-96g", 80 << 30, layer_tiers="60:experts=direct")


@pytest.mark.parametrize("mode", ["auto", "direct", "stream", "resident"])
def test_the_smallest_budget_with_experts_is_accepted_and_a_mib_less_is_not(mode):
    sizes = model_sizes(arch(), "bf16")
    options = MemoryConfig(offload="auto", moe_expert_tier=mode)
    p = detect("h100-sxm")
    minimum, layout = smallest_layout(sizes, p, options, 16, 1 << 30, 4096)
    planned = planning_sizes(sizes, options, p, 16)
    assert layout_for(planned, p, options, minimum, 16, 1 << 30, 4096).fits(minimum)
    less = minimum - (1 << 20)
    assert not layout_for(planned, p, options, less, 16, 1 << 30, 4096).fits(less)


def test_plan_runs_on_the_config_alone(capsys):
    assert main(["--model", QWEN3_30B, "--platform", "gh200-96g"]) == 0
    out = capsys.readouterr().out
    assert "routed experts (resident/direct/streamed/cpu of 128)" in out and "resident" in out
    assert main(["--model", QWEN3_30B, "--platform", "h100-sxm", "--offload", "stream"]) == 0
    assert "streamed" in capsys.readouterr().out


@pytest.mark.parametrize("platform, offloaded", [("gh200-144g", "direct"), ("h100-sxm", "streamed")])
def test_qwen3_235b_plans_with_its_expert_split(capsys, platform, offloaded):
    steps = {}
    for host in ("auto", "fp8"):
        assert main(["--model", QWEN3_235B, "--platform", platform, "--host-weight-dtype", host]) == 0
        out = capsys.readouterr().out
        rows = [line.split() for line in out.splitlines() if line.strip().split(" ")[0].isdigit()]
        splits = {row[-1] for row in rows if row[-1].count("/") == 3}
        assert len(rows) >= 94 and len(splits) == 1, splits      # every layer: the same split, named
        resident, direct, streamed, cpu = map(int, splits.pop().split("/"))
        assert resident + direct + streamed == 128 and 0 < resident < 128 and cpu == 0
        assert (direct if offloaded == "direct" else streamed) == 128 - resident
        assert f"0 {'streamed' if offloaded == 'direct' else 'direct'}" in out
        steps[host] = float(out.split("predicted decode step (batch 1): ")[1].split(" ms")[0])
    assert steps["fp8"] < steps["auto"]           # half the bytes cross the link per routed expert


@pytest.mark.parametrize("platform, ring", [("h100-sxm", True), ("gh200-144g", False)])
def test_cpu_moe_plans_every_expert_on_the_host_and_predicts_the_cores_reading_them(capsys, platform, ring):
    """--cpu-moe: no expert in device memory; a PCIe GPU books the expert ring (a step routing many tokens to one
    streams it), GH200 reads it in place; the step predicted from the host cores' rate is below all-streamed's on
    the PCIe host."""
    steps = {}
    for experts in ("--cpu-moe", "--moe-expert-tier=stream"):
        assert main(["--model", QWEN3_235B, "--platform", platform, experts]) == 0
        out = capsys.readouterr().out
        steps[experts] = float(out.split("predicted decode step (batch 1): ")[1].split(" ms")[0])
        if experts == "--cpu-moe":
            rows = [line.split() for line in out.splitlines() if line.strip().split(" ")[0].isdigit()]
            assert {row[-1] for row in rows if row[-1].count("/") == 3} == {"0/0/0/128"}
            assert "0 resident" in out and "12032 cpu" in out and "host cores reading cpu-tier experts" in out
            assert ("expert staging ring" in out) == ring
            # Fiddler's rule: the cores' time for a 37.7 MB expert grows with its pairs, the device's is flat (a
            # 55.2 GB/s copy on the PCIe host, a 330 GB/s read in place on GH200)
            limit = int(re.search(r"routing at most (\d+) pairs to it", out).group(1))
            assert limit == (55 if ring else 9)
    if platform == "h100-sxm":
        assert steps["--cpu-moe"] < steps["--moe-expert-tier=stream"] / 2
