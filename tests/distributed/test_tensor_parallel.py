"""Tensor parallelism on the CPU over gloo: TP=2 greedy tokens equal TP=1's in float32 for tiny random models
(KV heads split, one per rank, and replicated), each rank holds 1/N of the sharded bytes and only its KV heads,
a killed worker makes generate raise naming the rank within seconds, and close leaves no worker behind."""
from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from safetensors import safe_open

from gh200rt.distributed.errors import TensorParallelError
from gh200rt.distributed.launch import usable_cores
from gh200rt.distributed.sharding import TensorShard
from gh200rt.loader.load import read_arch
from gh200rt.sampling_params import SamplingParams
from tests.distributed.rank_children import rank_processes_of
from tests.distributed.tiny_tp_models import TP_FAMILIES, save_tp_tiny, tp_llm
from tests.engine.real_models import assert_same_or_near_tie

pytestmark = pytest.mark.skipif(usable_cores() < 2, reason="two ranks need two CPU cores")

PROMPTS = [[5, 9, 33, 71, 100, 4], list(range(7, 40)), [200, 3, 17]]
GREEDY = SamplingParams(temperature=0, max_tokens=16, logprobs=2)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return {family: save_tp_tiny(family, str(tmp_path_factory.mktemp(family))) for family in TP_FAMILIES}


def expected_rank_bytes(path: str, shard: TensorShard) -> int:
    """Norms whole; K/V 1/N of theirs where there are at least N KV heads (else one head's); the rest 1/N."""
    arch, n = shard.arch, shard.world_size
    total = 0
    with safe_open(os.path.join(path, "model.safetensors"), framework="pt") as f:
        for name in f.keys():
            nbytes = f.get_slice(name).get_shape()
            nbytes = int(torch.tensor(nbytes).prod()) * 4
            if "norm" in name:
                total += nbytes
            elif ".k_proj." in name or ".v_proj." in name:
                total += nbytes * shard.num_kv_heads // arch.num_kv_heads
            else:
                assert nbytes % n == 0, name
                total += nbytes // n
    return total


@pytest.mark.parametrize("family", sorted(TP_FAMILIES))
def test_tp2_greedy_equals_tp1_and_each_rank_holds_its_shard(checkpoints, family):
    path = checkpoints[family]
    prompt_logprobs = SamplingParams(temperature=0, max_tokens=4, logprobs=2, prompt_logprobs=1)
    single = tp_llm(path, 1)
    assert single.engine.parallel is None          # one rank: no process group, no worker
    reference = single.generate(PROMPTS, GREEDY)
    ref_prompt = single.generate(PROMPTS[1], prompt_logprobs)[0]
    single.engine.close()
    started = time.perf_counter()
    llm = tp_llm(path, 2)
    start_seconds = time.perf_counter() - started
    try:
        outputs = llm.generate(PROMPTS, GREEDY)
        differing = assert_same_or_near_tie(reference, outputs, f"{family} TP=2")
        prompt = llm.generate(PROMPTS[1], prompt_logprobs)[0]
        assert prompt.outputs[0].token_ids == ref_prompt.outputs[0].token_ids
        worst = max(abs(a[t].logprob - b[t].logprob) for a, b in zip(prompt.prompt_logprobs[1:],
                                                                      ref_prompt.prompt_logprobs[1:]) for t in a)
        assert worst < 1e-4, f"{family}: prompt logprobs differ by {worst:.3g}"
        shard = TensorShard(0, 2, read_arch(path))
        reports = llm.engine.parallel.reports
        print(f"{family}: start {start_seconds:.2f}s, {differing} near-tie divergences, prompt logprob diff "
              f"{worst:.2g}, bytes per rank {[reports[r]['weight_bytes'] for r in sorted(reports)]}")
        assert sorted(reports) == [0, 1]
        for rank, report in reports.items():
            rank_shard = TensorShard(rank, 2, shard.arch)
            assert report["weight_bytes"] == expected_rank_bytes(path, rank_shard), (rank, report)
            assert report["kv_heads"] == shard.num_kv_heads
        assert llm.engine.runner.kv_caches[0].shape[3] == shard.num_kv_heads   # rank 0's cache: its heads only
    finally:
        llm.engine.close()


def test_killed_worker_makes_generate_raise_naming_the_rank(checkpoints):
    llm = tp_llm(checkpoints["llama-gqa"], 2)
    try:
        llm.generate(PROMPTS[0], GREEDY)
        (pid,) = llm.engine.parallel.pids
        os.kill(pid, signal.SIGKILL)
        started = time.perf_counter()
        with pytest.raises(TensorParallelError, match="rank 1 failed: its process was killed by SIGKILL"):
            llm.generate(PROMPTS[1], GREEDY)
        seconds = time.perf_counter() - started
        print(f"killed worker reported after {seconds:.2f}s")
        assert seconds < 10
        with pytest.raises(TensorParallelError, match="rank 1"):   # and on every later step
            llm.generate(PROMPTS[0], GREEDY)
    finally:
        llm.engine.close()
    assert not llm.engine.parallel.processes[1].is_alive()


def test_close_stops_every_worker_and_restores_threads(checkpoints):
    threads = torch.get_num_threads()
    llm = tp_llm(checkpoints["qwen3-one-kv-head"], 2)
    workers = llm.engine.parallel
    llm.generate(PROMPTS[2], GREEDY)
    started = time.perf_counter()
    llm.engine.close()
    print(f"close took {time.perf_counter() - started:.2f}s")
    assert [p.exitcode for p in workers.processes.values()] == [0]     # stopped by rank 0, not killed
    ours = set(workers.pids)
    assert not ours & {p.pid for p in rank_processes_of()}
    for pid in ours:
        assert not os.path.exists(f"/proc/{pid}") or _parent(pid) != os.getpid()
    assert torch.get_num_threads() == threads
    llm.engine.close()                                                   # twice is fine


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None


def test_four_ranks_equal_one_and_may_share_the_cores(checkpoints, caplog):
    """TP=4 (issue 29's acceptance) gives TP=1's greedy tokens in float32, KV heads replicated (2 for 4 ranks);
    more ranks than cores run (one thread each, with a warning) rather than being refused."""
    prompts = [[5, 9, 13, 17], list(range(30, 52))]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    path = checkpoints["llama-gqa"]
    want = [o.outputs[0].token_ids for o in tp_llm(path, 1).generate(prompts, params)]
    with caplog.at_level("WARNING"):
        llm = tp_llm(path, 4)
    try:
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == want
    finally:
        llm.engine.close()
    if usable_cores() < 4:
        assert "4 ranks share the" in caplog.text


def test_worker_that_fails_to_load_names_its_rank_and_reason(checkpoints, tmp_path):
    from datetime import timedelta

    from gh200rt.config import EngineConfig
    from gh200rt.distributed.workers import TensorParallelWorkers
    arch = read_arch(checkpoints["llama-gqa"])
    missing = EngineConfig.from_kwargs(model=str(tmp_path / "gone"), dtype="float32", tensor_parallel_size=2)
    workers = TensorParallelWorkers(missing, arch, 1, timedelta(seconds=30))
    started = time.perf_counter()
    try:
        with pytest.raises(TensorParallelError, match="rank 1 failed: .*gone"):
            workers.wait_ready({"num_kv_blocks": 1})
        assert time.perf_counter() - started < 10
    finally:
        workers.close()
    assert not workers.processes[1].is_alive()
