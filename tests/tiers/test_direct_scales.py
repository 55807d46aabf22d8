"""DIRECT layers' scales in device memory (--direct-scales): what the planner books for them and what it
predicts, by hand for Llama-3-8B with int4 host weights on an H100 profile; on the CPU nothing moves."""
import re

import pytest

from gh200rt.config import MemoryConfig
from gh200rt.memory.ledger import KINDS
from gh200rt.models.arch_config import ArchConfig
from gh200rt.planner.cost_model import direct_layer_seconds, model_sizes
from gh200rt.planner.planner import make_plan
from gh200rt.platform.detect import Platform
from gh200rt.platform.profiles import get_profile

LLAMA3_8B = ArchConfig("llama", hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                       num_kv_heads=8, head_dim=128, vocab_size=128256)
CAPACITY = 40 << 30


def platform(name: str) -> Platform:
    return Platform.from_profile(get_profile(name))


def test_scale_bytes_by_hand():
    # per layer: qkv 6144x4096, o 4096x4096, gate_up 28672x4096, down 4096x14336 -> 218,103,808 weights
    weights = 6144 * 4096 + 4096 * 4096 + 28672 * 4096 + 4096 * 14336
    int4 = model_sizes(LLAMA3_8B, "bf16", host_format="int4")
    assert int4.host_scale_bytes == weights // 32 * 8          # fp32 scale and minimum per 32 weights
    int8 = model_sizes(LLAMA3_8B, "bf16", host_format="int8")
    assert int8.host_scale_bytes == 4 * (6144 + 4096 + 28672 + 4096)   # one fp32 scale per output channel
    assert model_sizes(LLAMA3_8B, "bf16", host_format="bf16").host_scale_bytes == 0


def test_plan_books_direct_scales_and_predicts_the_codes_alone_over_the_link():
    sizes = model_sizes(LLAMA3_8B, "bf16", host_format="int4")
    h100 = platform("h100-sxm")
    on = make_plan(sizes, h100, MemoryConfig(offload="direct"), CAPACITY)
    off = make_plan(sizes, h100, MemoryConfig(offload="direct", direct_scales="host"), CAPACITY)
    assert on.direct_scales_on_device and not off.direct_scales_on_device
    assert on.direct_scale_bytes == 32 * sizes.host_scale_bytes and off.direct_scale_bytes == 0
    block = sizes.kv_bytes_per_token * on.block_size
    assert off.num_kv_blocks - on.num_kv_blocks == -(-on.direct_scale_bytes // block) or \
        off.num_kv_blocks - on.num_kv_blocks == on.direct_scale_bytes // block
    codes = sizes.host_layer_bytes - sizes.host_scale_bytes
    assert direct_layer_seconds(sizes.layers[0], h100, True) == pytest.approx(
        codes / (h100.direct_read_gbps * 1e9) + sizes.host_scale_bytes / (h100.hbm_gbps * 1e9))
    assert direct_layer_seconds(sizes.layers[0], h100, False) == pytest.approx(
        sizes.host_layer_bytes / (h100.direct_read_gbps * 1e9))
    assert on.predicted_step_seconds < 0.75 * off.predicted_step_seconds   # a third of the link bytes gone
    assert "direct layers' scales in device memory" in on.explain()
    assert "direct layers' scales" not in off.explain()


def test_nothing_moves_on_the_cpu_or_for_dense_host_weights():
    cpu = make_plan(model_sizes(LLAMA3_8B, "bf16", host_format="int4"), platform("cpu"),
                    MemoryConfig(offload="direct"), CAPACITY)
    dense = make_plan(model_sizes(LLAMA3_8B, "bf16"), platform("h100-sxm"), MemoryConfig(offload="direct"), CAPACITY)
    resident = make_plan(model_sizes(LLAMA3_8B, "bf16", host_format="int4"), platform("h100-sxm"),
                         MemoryConfig(offload="none"), CAPACITY)
    for plan in (cpu, dense, resident):
        assert plan.direct_scale_bytes == 0
    assert not cpu.direct_scales_on_device and not dense.direct_scales_on_device


def test_a_budget_without_room_for_the_scales_is_refused_with_a_minimum_that_fits():
    sizes = model_sizes(LLAMA3_8B, "bf16", host_format="int4")
    memory = MemoryConfig(offload="direct", kv_cache_min_tokens=8192)
    h100 = platform("h100-sxm")
    with pytest.raises(ValueError) as refused:
        make_plan(sizes, h100, memory, 4 << 30)
    named = re.search(r"--offload direct --direct-scales host needs (\d+) bytes", str(refused.value))
    assert named, str(refused.value)
    host_only = MemoryConfig(offload="direct", direct_scales="host", kv_cache_min_tokens=8192)
    assert make_plan(sizes, h100, host_only, int(named.group(1))).kv_tokens >= 8192
    assert make_plan(sizes, h100, memory, refused.value.minimum).kv_tokens >= 8192


def test_config_refuses_an_unknown_placement_and_the_ledger_has_its_kind():
    with pytest.raises(ValueError, match="--direct-scales 'hbm': choose one of device, host"):
        MemoryConfig(direct_scales="hbm")
    assert "direct_scales" in KINDS
