import argparse

import pytest

from gh200rt.cli_args import add_engine_arguments, dataclass_from_args, engine_config_from_args
from gh200rt.config import CacheConfig, EngineConfig, GraphConfig, MemoryConfig, ModelConfig, SchedulerConfig, parse_layer_tiers, parse_size


@pytest.mark.parametrize("text,expected", [
    ("2GiB", 2 * 1024**3), ("512MiB", 512 * 1024**2), ("8GB", 8 * 1000**3), ("1.5GiB", int(1.5 * 1024**3)),
    ("4096", 4096), (123, 123), (None, None),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["two gigs", "5 parsecs", "-1GiB", "0", ""])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="--device-memory-budget"):
        MemoryConfig(device_memory_budget=text)


def test_layer_tiers():
    assert parse_layer_tiers("0-2:streamed,5:direct") == {0: "streamed", 1: "streamed", 2: "streamed", 5: "direct"}
    with pytest.raises(ValueError, match="LAYERS:TIER"):
        parse_layer_tiers("0-2:floppy")
    with pytest.raises(ValueError, match="layer index"):
        parse_layer_tiers("a-b:direct")


@pytest.mark.parametrize("make,flag", [
    (lambda: ModelConfig(dtype="float8"), "--dtype"),
    (lambda: ModelConfig(max_model_len=0), "--max-model-len"),
    (lambda: CacheConfig(block_size=12), "--block-size"),
    (lambda: CacheConfig(num_kv_blocks=0), "--num-kv-blocks"),
    (lambda: SchedulerConfig(max_num_seqs=0), "--max-num-seqs"),
    (lambda: SchedulerConfig(max_num_batched_tokens=0), "--max-num-batched-tokens"),
    (lambda: MemoryConfig(gpu_memory_utilization=1.5), "--gpu-memory-utilization"),
    (lambda: MemoryConfig(offload="sometimes"), "--offload"),
    (lambda: MemoryConfig(staging_slots=2, prefetch_distance=2), "--prefetch-distance"),
])
def test_invalid_values_name_their_flag(make, flag):
    with pytest.raises(ValueError, match=flag):
        make()


def test_from_kwargs_routes_and_rejects_unknown():
    cfg = EngineConfig.from_kwargs(model="x.gguf", block_size=32, max_num_seqs=4, offload="stream")
    assert (cfg.model.model, cfg.cache.block_size, cfg.scheduler.max_num_seqs, cfg.memory.offload) == \
        ("x.gguf", 32, 4, "stream")
    with pytest.raises(TypeError, match="unknown engine option 'blocksize'"):
        EngineConfig.from_kwargs(blocksize=32)


def test_a_steps_token_budget_defaults_by_platform_and_the_flag_wins():
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    default = dataclass_from_args(EngineConfig, parser.parse_args([])).scheduler
    assert default.max_num_batched_tokens is None
    assert (default.step_tokens(on_cpu=True), default.step_tokens(on_cpu=False)) == (512, 2048)
    asked = dataclass_from_args(EngineConfig, parser.parse_args(["--max-num-batched-tokens", "96"])).scheduler
    assert (asked.step_tokens(on_cpu=True), asked.step_tokens(on_cpu=False)) == (96, 96)


def test_cli_is_generated_from_every_field():
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    args = parser.parse_args(["--model", "m", "--no-enable-prefix-caching", "--num-kv-blocks", "64",
                              "--device-memory-budget", "1GiB", "--offload", "stream"])
    cfg = dataclass_from_args(EngineConfig, args)
    assert cfg.cache.enable_prefix_caching is False and cfg.cache.num_kv_blocks == 64
    assert cfg.memory.budget_bytes == 1024**3 and cfg.memory.offload == "stream"
    flags = {a.dest for a in parser._actions}
    for klass in (ModelConfig, CacheConfig, SchedulerConfig, MemoryConfig, GraphConfig):
        assert set(klass.__dataclass_fields__) <= flags


def test_cli_bad_value_is_a_usage_error(capsys):
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    args = parser.parse_args(["--block-size", "12"])
    with pytest.raises(SystemExit) as exc:
        engine_config_from_args(parser, args)
    assert exc.value.code == 2
    assert "--block-size must be a power of two" in capsys.readouterr().err
