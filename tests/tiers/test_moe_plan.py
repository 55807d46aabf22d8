"""Planning an MoE model from its config.json alone: Qwen3-30B-A3B's real shape (no weights)."""
import json

from gh200rt.models.arch_config import ArchConfig
from gh200rt.plan import main
from gh200rt.planner.cost_model import aligned_total, layer_linear_shapes, model_sizes

QWEN3_30B = "tests/fixtures/qwen3_30b_a3b"


def arch() -> ArchConfig:
    with open(f"{QWEN3_30B}/config.json") as f:
        return ArchConfig.from_hf_config(json.load(f))


def test_layer_bytes_count_every_expert_and_the_router():
    a = arch()
    assert (a.num_experts, a.num_experts_per_tok, a.moe_intermediate_size, a.norm_topk_prob) == (128, 8, 768, True)
    assert a.moe_layers == list(range(48)) and a.qk_norm and not a.attention_bias
    sizes = model_sizes(a, "bf16")
    attention = (4096 + 2 * 512) * 2048 + 2048 * 4096
    experts = 128 * 3 * 2048 * 768
    router = 128 * 2048
    assert sizes.layer_bytes == aligned_total([2 * n * k for n, k in layer_linear_shapes(a)])
    assert sizes.layer_bytes == 2 * (attention + experts + router)      # every part a multiple of 64 bytes
    total = sizes.fixed_bytes + 48 * sizes.layer_bytes
    assert 30.0e9 < total / 2 < 31.0e9, total / 2   # Qwen3-30B-A3B: 30.5B parameters
    # a token multiplies its 8 experts only (3.3B active parameters)
    active = 48 * sizes.layer_params + 2 * 151936 * 2048
    assert 3.0e9 < active < 3.6e9, active


def test_plan_runs_on_the_config_alone(capsys):
    assert main(["--model", QWEN3_30B, "--platform", "gh200-96g"]) == 0
    out = capsys.readouterr().out
    assert "1.161 GiB" in out and "resident" in out
    assert main(["--model", QWEN3_30B, "--platform", "h100-sxm", "--offload", "stream"]) == 0
    assert "streamed" in capsys.readouterr().out
