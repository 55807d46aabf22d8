"""Two "hosts" on localhost: this process is node 0 (rank 0, the engine) and ``python -m gh200rt.serve ... --nnodes 2
--node-rank 1`` another host running rank 1; TP=2 greedy tokens equal TP=1's, and closing the engine stops the other
host's agent with exit 0. torchrun's environment maps to the same ranks."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gh200rt.config import EngineConfig
from gh200rt.distributed.hosts import rendezvous, torchrun_config
from gh200rt.distributed.launch import usable_cores
from gh200rt.sampling_params import SamplingParams
from tests.distributed.tiny_tp_models import save_tp_tiny, tp_llm
from tests.engine.real_models import assert_same_or_near_tie

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPTS = [[5, 9, 33, 71, 100, 4], list(range(7, 40))]
GREEDY = SamplingParams(temperature=0, max_tokens=10, logprobs=2)


@pytest.mark.skipif(usable_cores() < 2, reason="two ranks need two CPU cores")
def test_two_hosts_with_one_rank_each_give_tp1_tokens(tmp_path):
    from tests.server.helpers import free_port
    path = save_tp_tiny("llama-gqa", str(tmp_path / "llama"))
    single = tp_llm(path, 1)
    reference = single.generate(PROMPTS, GREEDY)
    single.engine.close()
    port = free_port()
    hosts = ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(port)]
    log = open(tmp_path / "node1.log", "w")
    node1 = subprocess.Popen([sys.executable, "-m", "gh200rt.serve", "--model", path, "--dtype", "float32",
                              "--num-kv-blocks", "48", "--max-model-len", "128", "--max-num-seqs", "8",
                              "--tensor-parallel-size", "2", *hosts, "--node-rank", "1"],
                             cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": ROOT})
    try:
        llm = tp_llm(path, 2, nnodes=2, node_rank=0, master_addr="127.0.0.1", master_port=port)
        try:
            assert not llm.engine.parallel.processes          # node 0 spawns nobody: rank 1 is the other host's
            assert_same_or_near_tie(reference, llm.generate(PROMPTS, GREEDY), "two hosts, TP=2")
        finally:
            llm.engine.close()
        assert node1.wait(30) == 0, (tmp_path / "node1.log").read_text()[-3000:]
    finally:
        if node1.poll() is None:
            node1.kill()
            node1.wait()
        log.close()


def test_host_flags_and_torchrun_environment(monkeypatch):
    config = EngineConfig.from_kwargs(tensor_parallel_size=4, nnodes=2, node_rank=1, master_addr="10.0.0.1",
                                      master_port=29500)
    meet = rendezvous(config)
    assert meet.spawn == (2, 3) and meet.own_rank is None and meet.local_ranks == {2: (0, 2), 3: (1, 2)}
    head = rendezvous(EngineConfig.from_kwargs(tensor_parallel_size=4, nnodes=2, master_port=29500))
    assert head.spawn == (1,) and head.own_rank == 0
    with pytest.raises(ValueError, match="--nnodes 2: give --master-port"):
        EngineConfig.from_kwargs(tensor_parallel_size=2, nnodes=2)
    with pytest.raises(ValueError, match="--nnodes 3 must .* divide --tensor-parallel-size 2"):
        EngineConfig.from_kwargs(tensor_parallel_size=2, nnodes=3, master_port=1)
    for key, value in dict(RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", MASTER_ADDR="10.0.0.1",
                           MASTER_PORT="29400", TORCHELASTIC_USE_AGENT_STORE="True").items():
        monkeypatch.setenv(key, value)
    config = torchrun_config(EngineConfig.from_kwargs())
    assert config.parallel.tensor_parallel_size == 4 and config.parallel.master_port == 29400
    meet = rendezvous(config)
    assert meet.own_rank == 3 and meet.spawn == () and meet.local_ranks == {3: (1, 2)} and meet.agent_store
