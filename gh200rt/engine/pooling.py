"""Embedding requests: a prompt prefilled through the same steps as generation, its final hidden states
pooled into one vector, no token sampled and no KV kept afterwards.

The model's output (the final norm's) is pooled as vLLM pools decoder models:

- ``LAST``: the hidden state of the last input token (vLLM's default for ``embed`` on decoder models);
- ``MEAN``: the mean over every input token.

A prompt may be prefilled in several chunks (chunked prefill, or again from the start after a
preemption). The model runner returns, per chunk, the float64 sum of the rows ``pool_rows`` names;
``EmbeddingState`` adds the chunks up and divides at the end, so mean pooling covers every chunk and
barely depends on where the chunks were cut. A mean-pooled prompt is computed whole (no prefix-cache
hit skips its first positions); its full blocks are still published, as a generation prompt's are.
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from gh200rt.config import POOLING_TYPES
from gh200rt.engine.outputs import EmbeddingOutput, EmbeddingRequestOutput, RequestMetrics
from gh200rt.pooling_params import PoolingParams
from gh200rt.scheduler.request import Sequence


def pool_rows(pooling_type: str, start: int, end: int, num_tokens: int, flat: int) -> tuple[int, int] | None:
    """Flat rows of a chunk computing positions [start, end) whose hidden states pool (``flat`` is the row of
    ``start``); None when none of them does."""
    if pooling_type == "MEAN":
        return flat, flat + end - start
    assert pooling_type == "LAST", pooling_type
    return (flat + end - start - 1, flat + end - start) if end == num_tokens else None


class EmbeddingState:
    """One embedding request in the engine: its sequence and the pooled sum so far."""

    def __init__(self, request_id: str, seq: Sequence, params: PoolingParams):
        assert seq.pooling in POOLING_TYPES, seq.pooling
        self.request_id = request_id
        self.seqs = [seq]
        self.params = params
        self._sum: torch.Tensor | None = None
        self._rows = 0
        self.metrics = RequestMetrics(arrival_time=time.perf_counter())   # the engine stamps first_scheduled_time

    @property
    def seq(self) -> Sequence:
        return self.seqs[0]

    @property
    def finished(self) -> bool:
        return self.seq.num_computed_tokens == self.seq.num_tokens

    def add_chunk(self, start: int, end: int, rows_sum: torch.Tensor) -> None:
        """The runner's sum of the pooled rows of the chunk that computed positions [start, end); a chunk that starts
        at 0 starts over (a preempted prompt is prefilled again from its first token)."""
        rows = end - start if self.seq.pooling == "MEAN" else 1
        if start == 0 or self.seq.pooling == "LAST":
            self._sum, self._rows = rows_sum, rows
        else:
            assert self._rows == start, (self._rows, start)   # mean: chunks arrive in order, none missing
            self._sum, self._rows = self._sum + rows_sum, self._rows + rows

    def output(self) -> EmbeddingRequestOutput:
        seq = self.seq
        assert self._sum is not None and (seq.pooling == "LAST" or self._rows == seq.num_tokens), self._rows
        vector = (self._sum / self._rows).float()
        if self.params.normalize:
            vector = F.normalize(vector, p=2, dim=-1)
        self.metrics.finished_time = time.perf_counter()
        return EmbeddingRequestOutput(self.request_id, seq.prompt_token_ids, EmbeddingOutput(vector.tolist()),
                                      metrics=RequestMetrics(**vars(self.metrics)))
