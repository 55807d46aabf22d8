"""Which slice each rank holds, and the sizes tensor parallelism refuses (no process is started)."""
from __future__ import annotations

import pytest

from gh200rt.config import EngineConfig
from gh200rt.distributed.sharding import TensorShard, check_shardable
from gh200rt.models.arch_config import ArchConfig

LLAMA = ArchConfig("llama", hidden_size=64, intermediate_size=128, num_layers=1, num_heads=8, num_kv_heads=2,
                   head_dim=8, vocab_size=256)


def test_kv_heads_are_split_or_replicated():
    assert [TensorShard(r, 2, LLAMA).kv_head_start for r in range(2)] == [0, 1]
    four = [TensorShard(r, 4, LLAMA) for r in range(4)]
    assert [s.kv_head_start for s in four] == [0, 0, 1, 1]         # 2 KV heads on 4 ranks: each on two
    assert {s.num_kv_heads for s in four} == {1}
    # a rank's query heads all read the KV head it holds
    group = LLAMA.num_heads // LLAMA.num_kv_heads
    for s in four:
        heads = range(s.rank * s.num_heads, (s.rank + 1) * s.num_heads)
        assert {h // group for h in heads} == {s.kv_head_start}


def test_slices_cover_each_tensor_once():
    shards = [TensorShard(r, 4, LLAMA) for r in range(4)]
    for name, size in (("model.layers.0.self_attn.q_proj.weight", 64), ("model.layers.0.mlp.down_proj.weight", 128),
                       ("lm_head.weight", 256)):
        parts = sorted(s.checkpoint_slices()[name][1:] for s in shards)
        assert parts[0][0] == 0 and parts[-1][1] == size and all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
    local = shards[1].local_arch()
    assert (local.num_heads, local.num_kv_heads, local.intermediate_size, local.vocab_size) == (2, 1, 32, 256)


@pytest.mark.parametrize("arch,n,words", [
    (LLAMA, 3, "attention heads 8"),
    (ArchConfig("llama", 64, 120, 1, 8, 8, 8, 256), 16, "attention heads 8"),
    (ArchConfig("llama", 64, 100, 1, 8, 8, 8, 256), 8, "intermediate size 100"),
    (ArchConfig("llama", 64, 128, 1, 12, 6, 8, 256), 4, "6 KV heads"),
])
def test_sizes_that_do_not_divide_are_refused(arch, n, words):
    with pytest.raises(ValueError, match=f"--tensor-parallel-size {n}.*{words}"):
        check_shardable(arch, n)


def test_experts_are_split_along_their_intermediate_dimension_and_the_router_is_whole():
    qwen2 = ArchConfig("qwen2_moe", 64, 128, 1, 4, 2, 16, 256, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32, shared_expert_intermediate_size=48)
    shards = [TensorShard(r, 2, qwen2) for r in range(2)]
    p = "model.layers.0.mlp."
    for name, dim, size in ((f"{p}experts.3.gate_proj.weight", 0, 32), (f"{p}experts.0.down_proj.weight", 1, 32),
                            (f"{p}shared_expert.up_proj.weight", 0, 48), (f"{p}shared_expert.down_proj.weight", 1, 48)):
        parts = sorted(s.checkpoint_slices()[name] for s in shards)
        assert parts == [(dim, 0, size // 2), (dim, size // 2, size)], name
    assert f"{p}gate.weight" not in shards[0].checkpoint_slices()            # the router: whole on every rank
    assert f"{p}shared_expert_gate.weight" not in shards[0].checkpoint_slices()
    local = shards[1].local_arch()
    assert (local.moe_intermediate_size, local.shared_expert_intermediate_size) == (16, 24)
    mixtral = ArchConfig("mixtral", 64, 32, 1, 4, 2, 16, 256, num_experts=4, num_experts_per_tok=2,
                         moe_intermediate_size=32)
    assert TensorShard(1, 2, mixtral).checkpoint_slices()["model.layers.0.block_sparse_moe.experts.2.w2.weight"] \
        == (1, 16, 32)
    with pytest.raises(ValueError, match="--tensor-parallel-size 4 does not divide the model's shared expert "
                                         "intermediate size 6"):
        check_shardable(ArchConfig("qwen2_moe", 64, 128, 1, 4, 4, 16, 256, num_experts=4, num_experts_per_tok=2,
                                   moe_intermediate_size=32, shared_expert_intermediate_size=6), 4)


def test_a_vocabulary_that_does_not_divide_is_padded():
    arch = ArchConfig("llama", 64, 128, 1, 8, 8, 8, 250)
    shards = [TensorShard(r, 4, arch) for r in range(4)]
    assert {s.vocab_size for s in shards} == {63} and shards[0].padded_vocab_size == 252
    assert [s.checkpoint_slices()["lm_head.weight"] for s in shards] == [(0, 0, 63), (0, 63, 126), (0, 126, 189),
                                                                         (0, 189, 250)]
    assert [s.checkpoint_vocab_rows for s in shards] == [63, 63, 63, 61]


def test_config_flag_and_llm_option():
    assert EngineConfig.from_kwargs(tensor_parallel_size=2).parallel.tensor_parallel_size == 2
    with pytest.raises(ValueError, match="--tensor-parallel-size must be at least 1"):
        EngineConfig.from_kwargs(tensor_parallel_size=0)


def test_cli_flag_is_generated_from_the_config():
    import argparse

    from gh200rt.cli_args import add_engine_arguments, engine_config_from_args
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    config = engine_config_from_args(parser, parser.parse_args(["--tensor-parallel-size", "2"]))
    assert config.parallel.tensor_parallel_size == 2
