"""Planning DeepSeek-V3 from its published config.json alone (no weights): 671B parameters, 37B active, a latent
KV row of 576 values per token and layer, and its routed experts placed one by one in host memory."""
import json

import pytest

from gh200rt.config import MemoryConfig
from gh200rt.models.arch_config import ArchConfig
from gh200rt.plan import main
from gh200rt.planner.cost_model import aligned_total, layer_linear_shapes, model_sizes
from gh200rt.planner.planner import make_plan
from gh200rt.platform.detect import detect

DEEPSEEK_V3 = "tests/fixtures/deepseek_v3"


def arch() -> ArchConfig:
    with open(f"{DEEPSEEK_V3}/config.json") as f:
        return ArchConfig.from_hf_config(json.load(f))


def test_parameters_and_latent_kv_bytes():
    a = arch()
    sizes = model_sizes(a, "bf16")
    attention = 1536 * 7168 + 128 * 192 * 1536 + 576 * 7168 + 128 * 256 * 512 + 7168 * 128 * 128
    shared = 3 * 7168 * 2048
    router = 256 * 7168
    dense = 3 * 7168 * 18432
    # each layer is planned at its own kind's size: the three dense layers hold attention and an 18432-wide MLP, the
    # 58 sparse layers attention, the router and the shared expert (their routed experts are placed apart)
    assert [layer.kind for layer in sizes.layers] == ["dense"] * 3 + ["moe"] * 58
    dense_layer, moe_layer = sizes.layers[0], sizes.layers[3]
    assert dense_layer.resident_bytes == aligned_total([2 * n * k for n, k in layer_linear_shapes(a, "dense")]) \
        == 2 * (attention + dense) == sizes.layer_bytes
    assert moe_layer.resident_bytes == aligned_total([2 * n * k for n, k in layer_linear_shapes(a, "moe")]) \
        == 2 * (attention + router + shared)
    assert sizes.resident_memory() == 3 * dense_layer.resident_bytes + 58 * moe_layer.resident_bytes
    assert sizes.expert_bytes == 2 * 3 * 7168 * 2048
    total_params = (3 * (attention + dense) + 58 * (attention + router + shared) + 58 * 256 * 3 * 7168 * 2048
                    + 2 * 129280 * 7168)
    assert 665e9 < total_params < 675e9, total_params       # DeepSeek-V3: 671B without its MTP layer
    active = 3 * (attention + dense) + 58 * (attention + router + shared + 8 * 3 * 7168 * 2048) + 2 * 129280 * 7168
    assert 36e9 < active < 39e9, active                     # 37B activated
    assert sizes.kv_bytes_per_token == 61 * 576 * 2         # one latent row per layer, not K and V per head
    assert model_sizes(a, "bf16", kv_dtype="fp8").kv_bytes_per_token == 61 * 576


@pytest.mark.parametrize("platform,host", [("gh200-144g", "int4-g128"), ("gh200-96g", "int4-g128"),
                                           ("h100-sxm", "int4")])
def test_deepseek_v3_plans_with_its_experts_in_host_memory(capsys, platform, host):
    assert main(["--model", DEEPSEEK_V3, "--platform", platform, "--host-weight-dtype", host]) == 0
    out = capsys.readouterr().out
    assert "at 70272 bytes per token" in out
    assert "routed experts:" in out and (" direct" in out or " streamed" in out)
    assert "predicted decode step (batch 1)" in out


@pytest.mark.parametrize("host,hint", [("bf16", "a narrower --host-weight-dtype"), ("int8", "int4-g128"),
                                       ("int4", "int4-g128")])
def test_host_weights_beyond_a_gh200s_lpddr5x_are_refused_with_what_fits(capsys, host, hint):
    """A GH200 has 480 GB of LPDDR5X: V3's experts in bf16 (1.3 TB), int8 (640 GB) or int4 with a scale and minimum
    per 32 columns (482 GiB) do not fit it; int4-g128 (361 GiB) does."""
    assert main(["--model", DEEPSEEK_V3, "--platform", "gh200-144g", "--host-weight-dtype", host]) == 2
    err = capsys.readouterr().err
    assert "of weights in host memory" in err and "gh200-144g's 447.0 GiB (480 GB) of host memory" in err
    assert hint in err


def test_the_published_block_fp8_checkpoint_plans_its_experts_as_fp8_in_host_memory(capsys):
    """DeepSeek's own release is block-FP8 (128x128): planned with its fp8 codes and a scale per row and block as
    the host form, on a GPU its resident layers too; 671 GB of fp8 do not fit one GH200's host memory, int4-g128
    does."""
    a = arch()
    sizes = model_sizes(a, "bf16", host_format="fp8", fp8_group=128)
    codes, scales = 3 * 7168 * 2048, 4 * (4096 * 56 + 7168 * 16)
    assert sizes.host_expert_bytes == -(-(codes + scales) // 64) * 64
    assert main(["--model", f"{DEEPSEEK_V3}_fp8", "--platform", "gh200-144g"]) == 2    # 662 GiB of fp8
    captured = capsys.readouterr()
    assert "resident layers fp8, offloaded layers fp8 in host memory" in captured.out
    assert "more than gh200-144g's" in captured.err
    assert main(["--model", f"{DEEPSEEK_V3}_fp8", "--platform", "gh200-144g", "--host-weight-dtype", "int4-g128"]) == 0


def test_kimi_k2_needs_two_gh200s(capsys):
    """Kimi-K2 (DeepSeek-V3's architecture, 384 experts, 1T parameters): its int4-g128 experts alone exceed one
    GH200's LPDDR5X; over two (tensor parallel: each rank half of every expert's columns and of the heads, the latent
    row whole) each rank's host weights fit its own."""
    kimi = "tests/fixtures/kimi_k2"
    assert main(["--model", kimi, "--platform", "gh200-144g", "--host-weight-dtype", "int4-g128"]) == 2
    assert "536.5 GiB of weights in host memory (int4-g128), more than gh200-144g's" in capsys.readouterr().err
    assert main(["--model", kimi, "--platform", "gh200-144g", "--host-weight-dtype", "int4-g128",
                 "--tensor-parallel-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "32 of the model's 64 attention heads and the whole latent KV row (576 values" in out
    assert "host memory for offloaded weights:   268.521 GiB" in out and "at 70272 bytes per token" in out


@pytest.mark.parametrize("streamed,slot_kind", [("3-60:streamed", "moe"), ("0-60:streamed", "dense")])
def test_each_layer_kind_is_booked_at_its_own_size(streamed, slot_kind):
    """Planned at the largest kind, each of V3's 58 sparse layers would book a dense layer's 18432-wide MLP (~38 GiB of
    HBM); at its own size that memory goes to routed experts. A staging slot holds the largest layer that streams."""
    sizes = model_sizes(arch(), "bf16", host_format="int4-g128")
    kinds = sizes.kinds
    memory = MemoryConfig(offload="none", layer_tiers=streamed, moe_expert_tier="direct")
    plan = make_plan(sizes, detect("gh200-144g"), memory, 100 << 30, max_model_len=4096)
    resident = [i for i, tier in enumerate(plan.tiers) if tier == "resident"]
    assert resident == ([0, 1, 2] if slot_kind == "moe" else [])
    run = lambda layer: max(layer.resident_bytes, layer.run_bytes)  # noqa: E731  (whole KV blocks of the arena)
    assert plan.resident_weight_bytes == plan.sizes.fixed_memory + len(resident) * run(plan.sizes.layers[0])
    assert plan.slot_bytes == kinds[slot_kind].host_bytes and plan.layer_staging_bytes == 2 * plan.slot_bytes
    assert plan.host_weight_bytes == sum(kinds[layer.kind].host_bytes for layer, tier in
                                         zip(sizes.layers, plan.tiers) if tier != "resident") \
        + 58 * 256 * sizes.host_expert_bytes
    assert "layer kinds, each planned at its own size: 3 dense" in plan.explain()
