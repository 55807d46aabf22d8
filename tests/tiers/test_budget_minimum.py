"""A budget refusal names a true minimum: the budget the message names is accepted, one MiB less is refused,
and both refusals name the same minimum, across offload modes, CPU routes and GPU dtypes, host weight formats,
KV cache dtypes and --max-model-len. Planning only (``make_plan``), so the whole grid runs in about a second;
``test_engine_budget_minimum.py`` follows one refusal through the engine."""
from __future__ import annotations

import dataclasses
import re

import pytest

from gh200rt.config import MemoryConfig
from gh200rt.models.arch_config import ArchConfig
from gh200rt.planner.cost_model import activation_bytes, model_sizes
from gh200rt.planner.planner import PlanDoesNotFit, make_plan
from gh200rt.platform.detect import detect

MIB = 1 << 20
SMOLLM2 = ArchConfig("llama", hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9, num_kv_heads=3,
                     head_dim=64, vocab_size=49152, max_position_embeddings=8192, tie_word_embeddings=True)
QWEN2_05B = ArchConfig("qwen2", hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14,
                       num_kv_heads=2, head_dim=64, vocab_size=151936, max_position_embeddings=32768,
                       tie_word_embeddings=True, attention_bias=True)

MODES = {
    "auto": dict(offload="auto"),
    "none": dict(offload="none"),
    "stream": dict(offload="stream"),
    "stream K1 d0": dict(offload="stream", staging_slots=1, prefetch_distance=0),
    "stream K3": dict(offload="stream", staging_slots=3),
    "direct": dict(offload="direct"),
    "direct + streamed": dict(offload="direct", layer_tiers="0-9:streamed"),
    "mixed": dict(offload="none", layer_tiers="1:streamed,2:direct", staging_slots=1),
    "auto, layers 0 and 15 resident": dict(offload="auto", layer_tiers="0:resident,15:resident"),
    "dynamic": dict(offload="dynamic"),
    "dynamic K3": dict(offload="dynamic", staging_slots=3),
    "auto, 4096 KV tokens": dict(offload="auto", kv_cache_min_tokens=4096),
}


@dataclasses.dataclass(frozen=True)
class Target:
    """What the planner is handed on one platform: the compute dtype, the host format of offloaded layers, and
    the CPU route's forms beside resident linears (as ``engine/bootstrap.py`` sizes them)."""
    platform: str
    dtype: str
    host_format: str | None = None
    reordered_copies: bool = False      # the fp32 route: a oneDNN copy beside every resident linear

    def sizes(self, arch: ArchConfig, kv_dtype: str):
        sizes = model_sizes(arch, self.dtype, kv_dtype=kv_dtype, host_format=self.host_format)
        if self.reordered_copies:
            sizes = dataclasses.replace(
                sizes.map_layers(lambda layer: dataclasses.replace(layer, form_bytes=layer.resident_bytes)),
                head_form_bytes=sizes.head_bytes)
        return sizes


TARGETS = {
    "cpu fp32 route": Target("cpu", "fp32", reordered_copies=True),
    "cpu fp16 route": Target("cpu", "fp32"),           # fp16 forms take the booked fp32 bytes
    "cpu bf16 route": Target("cpu", "bf16"),
    "cpu bf16 route, int4 host": Target("cpu", "bf16", host_format="int4"),
    "gh200 bf16": Target("gh200-96g", "bf16"),
    "h100 fp16, int8 host": Target("h100-sxm", "fp16", host_format="int8"),
}
KV_CACHE_DTYPES = ("auto", "fp8")
MAX_MODEL_LENS = (1, 2048, 8192)


def named_minimum(refusal: PlanDoesNotFit) -> int:
    found = re.search(r"smallest plan.*? needs (\d+) bytes", str(refusal))
    assert found, f"the refusal names no minimum: {refusal}"
    return int(found.group(1))


def refusal(plan_at) -> PlanDoesNotFit | None:
    try:
        plan_at()
    except PlanDoesNotFit as err:
        return err
    return None


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mode", MODES)
def test_named_minimum_is_accepted_and_one_mib_less_refused(mode, target):
    memory, target_ = MemoryConfig(**MODES[mode]), TARGETS[target]
    platform = detect(target_.platform)
    for arch in (SMOLLM2, QWEN2_05B):
        activations = activation_bytes(arch, 2048, 256, target_.dtype)
        for kv_dtype in KV_CACHE_DTYPES:
            sizes = target_.sizes(arch, kv_dtype)
            for max_model_len in MAX_MODEL_LENS:
                case = f"{arch.architecture} kv {kv_dtype} max_model_len {max_model_len}"

                def plan_at(budget: int):
                    return lambda: make_plan(sizes, platform, memory, budget, activation_bytes=activations,
                                             max_model_len=max_model_len)
                first = refusal(plan_at(MIB))
                assert first is not None, f"{case}: 1 MiB was accepted"
                minimum = named_minimum(first)
                accepted = refusal(plan_at(minimum))
                assert accepted is None, f"{case}: the named minimum {minimum} is refused: {accepted}"
                below = refusal(plan_at(minimum - MIB))
                assert below is not None, f"{case}: {minimum - MIB} (one MiB below the named minimum) is accepted"
                assert named_minimum(below) == minimum, case


def test_refusal_names_the_numbers_and_the_flags():
    sizes = TARGETS["cpu fp32 route"].sizes(SMOLLM2, "auto")
    memory = MemoryConfig(offload="stream")
    activations = activation_bytes(SMOLLM2, 2048, 256, "fp32")
    err = refusal(lambda: make_plan(sizes, detect("cpu"), memory, 700 * MIB, activation_bytes=activations,
                                    max_model_len=8192))
    assert err is not None
    text = str(err)
    assert "--offload stream" in text and "--device-memory-budget" in text and "--max-model-len" in text
    assert "K=2" in text                      # the ring --offload stream books by default, not K=1
    assert "--staging-slots 1" in text         # and the cheaper ring it could book instead
