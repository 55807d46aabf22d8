"""What the engine keeps per user request: its choices (sequences), their detokenizers, and how
much of each has been reported, so every step's ``RequestOutput`` carries exact deltas."""
from __future__ import annotations

import time

import torch

from gh200rt.engine.detokenizer import IncrementalDetokenizer
from gh200rt.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput, TokenLogprobs
from gh200rt.engine.sampler import token_logprobs
from gh200rt.sampling_params import SamplingParams
from gh200rt.scheduler.request import Sequence


def prompt_logprobs_for_chunk(chunk_logits: torch.Tensor, prompt: list[int], start: int,
                              k: int) -> list[TokenLogprobs]:
    """Row r holds the logits at prompt position start + r, which score prompt token start + r + 1."""
    targets = prompt[start + 1:start + 1 + chunk_logits.shape[0]]
    if not targets:
        return []
    return token_logprobs(torch.log_softmax(chunk_logits[:len(targets)], dim=-1), targets, k)


class RequestState:
    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int], params: SamplingParams):
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.seqs: list[Sequence] = []
        self.detoks: list[IncrementalDetokenizer] = []
        self._reported_tokens: list[int] = []
        self.prompt_logprobs: list[TokenLogprobs | None] | None = [None] if params.prompt_logprobs is not None \
            else None
        self.metrics = RequestMetrics(arrival_time=time.perf_counter())

    @property
    def finished(self) -> bool:
        return all(s.is_finished for s in self.seqs)

    def make_output(self, advanced: set[int]) -> RequestOutput:
        while len(self._reported_tokens) < len(self.seqs):
            self._reported_tokens.append(0)
        outputs = []
        want_lp = self.params.logprobs is not None
        finished = True
        for seq, detok in zip(self.seqs, self.detoks):
            done = seq.is_finished
            finished = finished and done
            moved = seq.index in advanced
            before = self._reported_tokens[seq.index]
            new_ids = seq.output_token_ids[before:] if moved else []
            delta_text = detok.delta(final=done) if moved else ""
            self._reported_tokens[seq.index] = before + len(new_ids)
            outputs.append(CompletionOutput.snapshot(
                seq.index, detok.pieces, detok.emitted, seq.output_token_ids, seq.output_logprobs if want_lp else None,
                cumulative_logprob=seq.cumulative_logprob if want_lp else None,
                finish_reason=seq.finish_reason if moved else None,
                stop_reason=seq.stop_reason, delta_text=delta_text, delta_token_ids=new_ids,
                delta_logprobs=seq.output_logprobs[before:] if want_lp and moved else None))
        metrics = self.metrics
        firsts = [s.first_token_time for s in self.seqs if s.first_token_time is not None]
        lasts = [s.last_token_time for s in self.seqs if s.last_token_time is not None]
        metrics.first_token_time = min(firsts, default=None)
        metrics.last_token_time = max(lasts, default=None)
        if finished and metrics.finished_time is None:
            metrics.finished_time = time.perf_counter()
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, outputs, finished=finished,
                             prompt_logprobs=self.prompt_logprobs, num_cached_tokens=self.seqs[0].num_cached_tokens,
                             metrics=RequestMetrics(**vars(metrics)))
