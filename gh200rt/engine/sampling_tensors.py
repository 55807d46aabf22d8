"""One step's sampling parameters as tensors on the logits' device, built from host lists.

Every tensor goes host -> device in one non-blocking copy from page-locked memory when the device
is a GPU (``device_inputs.to_device``), so building them never stalls the host on the GPU. Token-id lists of
different lengths are padded with ``V`` (one past the vocabulary): scattered into a ``[R, V + 1]``
table, the padding lands in a column that is then dropped.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gh200rt.engine.device_inputs import to_device
from gh200rt.scheduler.request import Sequence


def padded_ids(rows: list[list[int]], pad: int, device: torch.device) -> torch.Tensor:
    """int64 ``[len(rows), longest]`` (at least one column), short rows padded with ``pad``."""
    width = max(1, max((len(r) for r in rows), default=0))
    return to_device([r + [pad] * (width - len(r)) for r in rows], torch.int64, device)


def id_counts(rows: list[list[int]], vocab: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``[len(rows), vocab]``: how often each token id occurs in each row."""
    index = padded_ids(rows, vocab, device)
    counts = torch.zeros(len(rows), vocab + 1, dtype=dtype, device=device)
    counts.scatter_add_(1, index, torch.ones_like(index, dtype=dtype))
    return counts[:, :vocab]


@dataclass
class SamplingTensors:
    """Per-row parameters of the rows that draw at random (``random_rows`` of the batch)."""
    random_rows: torch.Tensor          # int64 [R]
    temperature: torch.Tensor          # float32 [R, 1]
    top_k: torch.Tensor                # int64 [R]; 0 = off
    top_p: torch.Tensor                # float32 [R]; 1.0 = off
    min_p: torch.Tensor                # float32 [R]; 0.0 = off
    any_top_k: bool
    any_top_p: bool
    any_min_p: bool
    max_top_k: int

    def select(self, rows: torch.Tensor) -> "SamplingTensors":
        """The same parameters for a subset of these rows (``rows`` index this batch's rows)."""
        return SamplingTensors(self.random_rows.index_select(0, rows), self.temperature.index_select(0, rows),
                               self.top_k.index_select(0, rows), self.top_p.index_select(0, rows),
                               self.min_p.index_select(0, rows), self.any_top_k, self.any_top_p, self.any_min_p,
                               self.max_top_k)

    @classmethod
    def build(cls, seqs: list[Sequence], rows: list[int], device: torch.device) -> "SamplingTensors":
        params = [seqs[i].params for i in rows]
        floats = to_device([[p.temperature, p.top_p, p.min_p] for p in params], torch.float32, device)
        return cls(random_rows=to_device(rows, torch.int64, device), temperature=floats[:, 0:1],
                   top_k=to_device([p.top_k or 0 for p in params], torch.int64, device),
                   top_p=floats[:, 1], min_p=floats[:, 2],
                   any_top_k=any(p.top_k for p in params), any_top_p=any(p.top_p < 1.0 for p in params),
                   any_min_p=any(p.min_p > 0.0 for p in params), max_top_k=max(p.top_k or 0 for p in params))


def needs_penalties(seq: Sequence) -> bool:
    p = seq.params
    return p.repetition_penalty != 1.0 or bool(p.presence_penalty) or bool(p.frequency_penalty)


def apply_penalties(logits: torch.Tensor, seqs: list[Sequence], rows: list[int],
                    in_flight: tuple[list[int], torch.Tensor] | None = None) -> None:
    """Repetition (over prompt and output, or their last ``repetition_window`` tokens), presence and frequency
    (over output) penalties, in place. ``in_flight``: (batch rows, their tokens) that only the device holds yet (a
    step launched ahead, engine/run_ahead.py): each counts as its row's latest output token."""
    device, vocab = logits.device, logits.shape[1]
    index = to_device(rows, torch.int64, device)
    sub = logits.index_select(0, index)
    params = [seqs[i].params for i in rows]
    ahead = set(in_flight[0]) if in_flight is not None else set()
    pending = [i in ahead for i in rows]
    if any(pending):       # each penalised row's token in flight, or -1 (none)
        fed_rows, fed_tokens = in_flight
        every = torch.full((logits.shape[0],), -1, dtype=torch.int64, device=device)
        every.index_copy_(0, to_device(fed_rows, torch.int64, device), fed_tokens)
        latest = every.index_select(0, index)
    if any(p.repetition_penalty != 1.0 for p in params):
        counts = id_counts([_penalised_ids(seqs[i], ahead) for i, ahead in zip(rows, pending)], vocab, device,
                           torch.int32)
        if any(pending):     # a window of 0 tokens covers none, the one in flight neither
            covered = to_device([p.repetition_window != 0 for p in params], torch.bool, device)
            counts = _count_in_flight(counts, torch.where(covered, latest, -1))
        penalty = to_device([p.repetition_penalty for p in params], torch.float32, device).unsqueeze(1)
        penalised = torch.where(sub > 0, sub / penalty, sub * penalty)
        sub = torch.where(counts > 0, penalised, sub)
    if any(p.presence_penalty or p.frequency_penalty for p in params):
        counts = id_counts([seqs[i].output_token_ids for i in rows], vocab, device, sub.dtype)
        if any(pending):
            counts = _count_in_flight(counts, latest)
        weights = to_device([[p.frequency_penalty, p.presence_penalty] for p in params], sub.dtype, device)
        sub = sub - (weights[:, 0:1] * counts + weights[:, 1:2] * (counts > 0).to(sub.dtype))
    logits.index_copy_(0, index, sub)


def _count_in_flight(counts: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``counts`` [R, V] plus one at each row's token in ``tokens`` [R] (none where it is -1)."""
    present = (tokens >= 0).to(counts.dtype).unsqueeze(1)
    return counts.scatter_add(1, tokens.clamp(min=0).unsqueeze(1), present)


def _penalised_ids(seq: Sequence, in_flight: bool = False) -> list[int]:
    """The host's tokens a repetition penalty covers; with a token in flight, the window's oldest one makes room."""
    ids, window = seq.all_token_ids, seq.params.repetition_window
    if window is None:
        return ids
    window = max(0, window - in_flight)
    return ids[len(ids) - min(window, len(ids)):]


def banned_until_min_tokens(seq: Sequence, in_flight: bool = False) -> list[int]:
    """Ids a sequence may not produce yet: its stop ids and EOS while it has fewer than min_tokens (``in_flight``:
    one more output token is on the device)."""
    p = seq.params
    if len(seq.output_token_ids) + in_flight >= p.min_tokens:
        return []
    return sorted(set(p.stop_token_ids) | (set() if p.ignore_eos else set(seq.eos_token_ids)))


def mask_ids(logits: torch.Tensor, rows: list[int], ids: list[list[int]]) -> None:
    """Set ``logits[rows[j], ids[j]]`` to -inf, in place."""
    vocab = logits.shape[1]
    index = to_device(rows, torch.int64, logits.device)
    mask = torch.zeros(len(rows), vocab + 1, dtype=torch.bool, device=logits.device)
    mask.scatter_(1, padded_ids(ids, vocab, logits.device), True)
    logits.index_copy_(0, index, logits.index_select(0, index).masked_fill(mask[:, :vocab], float("-inf")))
