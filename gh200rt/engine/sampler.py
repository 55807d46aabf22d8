"""Turn one step's logits into tokens, one row per sampling sequence.

Order per row: min_tokens mask -> repetition / presence / frequency penalties -> temperature ->
top-k -> top-p -> min-p -> draw. Greedy rows take the argmax of the penalised logits. A seeded
row draws with its sequence's own ``torch.Generator`` (an exponential race, one draw per row), so
its tokens do not depend on what else is in the batch; unseeded rows draw from the engine's
generator. Logprobs are of the model's raw distribution (log_softmax of the logits).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gh200rt.engine.logits_processors import apply_logits_processors
from gh200rt.engine.outputs import Logprob, TokenLogprobs
from gh200rt.scheduler.request import Sequence


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]     # per row; None when the request asked for none
    chosen_logprobs: list[float]


def apply_penalties(logits: torch.Tensor, seq: Sequence) -> None:
    """In place on one row [V]."""
    p = seq.params
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(seq.all_token_ids)), dtype=torch.int64)
        vals = logits[seen]
        logits[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and seq.output_token_ids:
        out = torch.tensor(seq.output_token_ids, dtype=torch.int64)
        counts = torch.bincount(out, minlength=logits.shape[0]).to(logits.dtype)
        logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)


def truncate(probs_logits: torch.Tensor, top_k: int, top_p: float, min_p: float) -> None:
    """Mask (to -inf, in place) what top-k, top-p and min-p exclude from one temperature-scaled row."""
    row = probs_logits
    if top_k and top_k < row.shape[0]:
        kth = torch.topk(row, top_k).values[-1]
        row[row < kth] = float("-inf")
    if top_p < 1.0:
        sorted_logits, order = torch.sort(row, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs
        drop = before >= top_p                    # keep the smallest prefix whose mass reaches top_p
        row[order[drop]] = float("-inf")
    if min_p > 0.0:
        probs = torch.softmax(row, dim=-1)
        row[probs < min_p * probs.max()] = float("-inf")


def top_logprobs(logprobs_row: torch.Tensor, chosen: int, k: int) -> TokenLogprobs:
    result: TokenLogprobs = {}
    chosen_lp = logprobs_row[chosen].item()
    rank = int((logprobs_row > chosen_lp).sum().item()) + 1
    if k:
        values, ids = torch.topk(logprobs_row, k)
        for r, (v, t) in enumerate(zip(values.tolist(), ids.tolist()), start=1):
            result[t] = Logprob(v, r)
    result[chosen] = Logprob(chosen_lp, rank)
    return result


class Sampler:
    def __init__(self, seed: int = 0):
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> SampleResult:
        assert logits.shape[0] == len(seqs)
        want_logprobs = any(s.params.logprobs is not None for s in seqs)
        raw_logprobs = torch.log_softmax(logits, dim=-1) if want_logprobs else None
        apply_logits_processors(logits, seqs)       # logit_bias, grammar masks: after raw logprobs, before sampling
        simple = [i for i, s in enumerate(seqs) if _is_plain_greedy(s)]
        tokens = [0] * len(seqs)
        if simple:
            ids = torch.argmax(logits[simple], dim=-1).tolist()
            for i, t in zip(simple, ids):
                tokens[i] = t
        simple_set = set(simple)
        for i, seq in enumerate(seqs):
            if i not in simple_set:
                tokens[i] = self._sample_row(logits[i].clone(), seq)
        row_logprobs: list[TokenLogprobs | None] = [None] * len(seqs)
        chosen: list[float] = [0.0] * len(seqs)
        if raw_logprobs is not None:
            for i, seq in enumerate(seqs):
                if seq.params.logprobs is not None:
                    row_logprobs[i] = top_logprobs(raw_logprobs[i], tokens[i], seq.params.logprobs)
                    chosen[i] = row_logprobs[i][tokens[i]].logprob
        return SampleResult(tokens, row_logprobs, chosen)

    def _sample_row(self, row: torch.Tensor, seq: Sequence) -> int:
        p = seq.params
        if len(seq.output_token_ids) < p.min_tokens:
            banned = set(p.stop_token_ids) | (set() if p.ignore_eos else set(seq.eos_token_ids))
            if banned:
                row[torch.tensor(sorted(banned), dtype=torch.int64)] = float("-inf")
        apply_penalties(row, seq)
        if p.greedy:
            return int(torch.argmax(row).item())
        row /= p.temperature
        truncate(row, p.top_k, p.top_p, p.min_p)
        probs = torch.softmax(row, dim=-1)
        noise = torch.empty_like(probs).exponential_(generator=seq.generator or self.generator)
        return int(torch.argmax(probs / noise).item())


def _is_plain_greedy(seq: Sequence) -> bool:
    p = seq.params
    return (p.greedy and p.repetition_penalty == 1.0 and not p.presence_penalty and not p.frequency_penalty
            and len(seq.output_token_ids) >= p.min_tokens)
