"""Tensor parallelism over NCCL on 2+ GPUs (skipped elsewhere): TP=2 greedy tokens equal TP=1's in float32 for the
three tiny families (KV heads split and replicated), each rank on its own GPU with its slabs on that GPU's node, and
a SIGKILLed worker makes generate raise naming rank 1."""
from __future__ import annotations

import os
import signal

import pytest
import torch

from gh200rt.distributed.errors import TensorParallelError
from gh200rt.sampling_params import SamplingParams
from tests.distributed.tiny_tp_models import TP_FAMILIES, save_tp_tiny, tp_llm
from tests.engine.real_models import assert_same_or_near_tie

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                 reason="NCCL tensor parallelism needs two GPUs")]
PROMPTS = [[5, 9, 33, 71, 100, 4], list(range(7, 40)), [200, 3, 17]]
GREEDY = SamplingParams(temperature=0, max_tokens=16, logprobs=2)


@pytest.mark.parametrize("family", sorted(TP_FAMILIES))
def test_nccl_tp2_greedy_equals_tp1(tmp_path, family):
    path = save_tp_tiny(family, str(tmp_path / family))
    single = tp_llm(path, 1, enforce_eager=True)
    reference = single.generate(PROMPTS, GREEDY)
    single.engine.close()
    llm = tp_llm(path, 2, enforce_eager=True)
    try:
        assert_same_or_near_tie(reference, llm.generate(PROMPTS, GREEDY), f"{family} NCCL TP=2")
        assert type(llm.engine.runner.model.state.data).__name__ == "ProcessGroupNCCL"
    finally:
        llm.engine.close()


def test_nccl_killed_worker_names_the_rank(tmp_path):
    llm = tp_llm(save_tp_tiny("llama-gqa", str(tmp_path / "llama")), 2, enforce_eager=True)
    try:
        llm.generate(PROMPTS[0], GREEDY)
        os.kill(llm.engine.parallel.pids[0], signal.SIGKILL)
        with pytest.raises(TensorParallelError, match="rank 1 failed"):
            llm.generate(PROMPTS[1], GREEDY)
    finally:
        llm.engine.close()
