"""Planning per tensor-parallel rank (no process is started): ``python -m gh200rt.plan --tensor-parallel-size 2``
plans one rank's shard of Llama-3.1-70B on gh200-96g and h100-sxm, whose layers, embedding and LM head are half of
TP=1's (vocab-parallel), and the ranks agree on the smallest free memory."""
from __future__ import annotations

import json
import re

import pytest

from gh200rt.distributed.sharding import TensorShard
from gh200rt.models.arch_config import ArchConfig
from gh200rt.plan import main as plan_main
from gh200rt.planner.cost_model import model_sizes
from gh200rt.planner.planner import RankShare

LLAMA_70B = "tests/fixtures/llama31_70b"


def gib(text: str, label: str) -> float:
    return float(re.search(rf"{label}\s+([\d.]+) GiB", text).group(1))


@pytest.mark.parametrize("platform", ["gh200-96g", "h100-sxm"])
def test_plan_70b_per_rank(capsys, platform):
    assert plan_main(["--model", LLAMA_70B, "--platform", platform, "--offload", "none",
                      "--device-memory-budget", "200GiB"]) == 0
    whole = capsys.readouterr().out
    assert plan_main(["--model", LLAMA_70B, "--platform", platform, "--tensor-parallel-size", "2"]) == 0
    rank = capsys.readouterr().out
    print(rank)
    assert "tensor parallel: 2 ranks, one plan for all" in rank and "4 of the model's 8 KV heads (split)" in rank
    layer = r"\n\s+0 resident\s+"
    assert gib(rank, layer) == pytest.approx(gib(whole, layer) / 2, rel=1e-3)
    device_weights = "device memory for weights \\(resident layers and experts, embeddings, norms\\):"
    assert gib(rank, device_weights) == pytest.approx(gib(whole, device_weights) / 2, rel=2e-3)
    assert re.search(r"per rank: layers [\d.]+ GiB on the device .*LM head ([\d.]+) GiB", rank).group(1) == "0.979"
    if platform == "h100-sxm":     # 80 GB: 1/2 of the 70B in bf16 (66 GiB) fits with every layer resident
        assert "80 resident" in rank and "KV cache: " in rank


def test_rank_sizes_hold_one_nth_of_embedding_and_head():
    config = json.load(open(f"{LLAMA_70B}/config.json"))
    arch = ArchConfig.from_hf_config(config)
    whole = model_sizes(arch, "bf16")
    shard = TensorShard(0, 2, arch)
    rank = model_sizes(shard.local_arch(), "bf16", vocab_rows=shard.vocab_size)
    assert rank.head_bytes * 2 == whole.head_bytes
    assert rank.layer_bytes * 2 == whole.layer_bytes
    assert rank.kv_bytes_per_token * 2 == whole.kv_bytes_per_token
    norms = (arch.hidden_size + arch.num_layers * 2 * arch.hidden_size) * 2          # replicated on every rank
    embeds = 2 * arch.vocab_size * arch.hidden_size * 2                               # untied embedding and head
    assert whole.fixed_bytes - rank.fixed_bytes == embeds // 2 and rank.fixed_bytes > norms + embeds // 2


def test_replicated_kv_heads_are_named():
    qwen = ArchConfig("qwen3", 64, 128, 2, 4, 1, 16, 256)
    assert "1 of the model's 1 KV heads (replicated on 2 ranks)" in RankShare.of(qwen, 2).describe()


def test_ranks_plan_for_the_smallest_free_memory():
    from datetime import timedelta

    import torch.distributed as dist

    from gh200rt.distributed.parallel_state import smallest_across_ranks
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    store.set("free/1", str(70 << 30))                      # rank 1 has less free memory
    waits = []
    assert smallest_across_ranks(store, "free", 0, 2, 75 << 30, on_wait=lambda: waits.append(1)) == 70 << 30
