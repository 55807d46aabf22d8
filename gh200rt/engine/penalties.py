"""Repetition, frequency and presence penalties, applied in place at the logits of the ids a row's tokens hold.

A penalty changes only the logits of ids that occurred, so it is applied at those positions alone: gathered from
the logits, penalised and written back. The ids and their counts come from running counts beside each sequence
(``PenaltyCounts``), which catch up on the tokens appended since the step before. Per step the host's work is what
the step added and the device's the number of distinct ids; counting every row's whole history into a
``[rows, vocab]`` table each step and rewriting that table took 26 ms at batch 64 on 2 CPUs (SmolLM2's 49,152 ids)
and grew with the output (150 ms at 16,384 tokens; ``python -m gh200rt.bench kernel reporting``).

Each position gets what the dense formulas give it (``tests/unit/test_penalties.py`` keeps them as the reference):
repetition ``x / r if x > 0 else x * r`` over the prompt and output (or their last ``repetition_window`` tokens),
then ``x - (frequency * count + presence * (count > 0))`` over the output. A row whose penalty is neutral (1, or 0)
is left out: the dense formulas leave its values as they are.
"""
from __future__ import annotations

import numpy as np
import torch

from gh200rt.engine.device_inputs import array_to_device, to_device
from gh200rt.scheduler.request import Sequence


class TokenCounts:
    """How often each id occurs in a growing token list: ids in first-seen order and their counts (numpy arrays
    grown by doubling), and how many of the list's tokens are counted (``seen``)."""

    def __init__(self):
        self.ids = np.empty(16, dtype=np.int64)
        self.counts = np.zeros(16, dtype=np.int32)
        self.size = 0
        self.seen = 0
        self._slot: dict[int, int] = {}

    def catch_up(self, tokens: list[int]) -> None:
        """Count ``tokens[seen:]`` (the list only grows)."""
        for token in tokens[self.seen:]:
            slot = self._slot.get(token)
            if slot is None:
                if self.size == len(self.ids):
                    self.ids = np.concatenate([self.ids, np.empty_like(self.ids)])
                    self.counts = np.concatenate([self.counts, np.zeros_like(self.counts)])
                slot = self._slot[token] = self.size
                self.ids[slot] = token
                self.size += 1
            self.counts[slot] += 1
        self.seen = len(tokens)


class PenaltyCounts:
    """A sequence's running counts: of its output tokens (frequency, presence) and of its prompt and output tokens
    (repetition without a window); made on its first penalised step (``Sequence.penalty_counts``)."""

    def __init__(self):
        self.output = TokenCounts()
        self.everything = TokenCounts()


def needs_penalties(seq: Sequence) -> bool:
    p = seq.params
    return p.repetition_penalty != 1.0 or bool(p.presence_penalty) or bool(p.frequency_penalty)


def _counts_of(seq: Sequence) -> PenaltyCounts:
    if seq.penalty_counts is None:
        seq.penalty_counts = PenaltyCounts()
    return seq.penalty_counts


def _repetition_ids(seq: Sequence, in_flight: bool) -> np.ndarray:
    """The host's ids a repetition penalty covers (a window's may repeat); with a token in flight, the window's
    oldest one makes room for it."""
    window = seq.params.repetition_window
    if window is None:
        counts = _counts_of(seq).everything
        counts.catch_up(seq.all_token_ids)
        return counts.ids[:counts.size]
    ids = seq.all_token_ids
    window = max(0, window - in_flight)
    return np.asarray(ids[len(ids) - min(window, len(ids)):], dtype=np.int64)


def apply_penalties(logits: torch.Tensor, seqs: list[Sequence], rows: list[int],
                    in_flight: tuple[list[int], torch.Tensor] | None = None) -> None:
    """Repetition (over prompt and output, or their last ``repetition_window`` tokens), presence and frequency
    (over output) penalties of ``rows``, in place. ``in_flight``: (batch rows, their tokens) that only the device
    holds yet (a step launched ahead, engine/run_ahead.py): each counts as its row's latest output token."""
    assert logits.dim() == 2
    flat = logits if logits.is_contiguous() else logits.contiguous()
    vocab, device = logits.shape[1], logits.device
    ahead = set(in_flight[0]) if in_flight is not None else set()
    latest = None
    if ahead:              # each row's token in flight, or -1 (none)
        fed_rows, fed_tokens = in_flight
        latest = torch.full((logits.shape[0],), -1, dtype=torch.int64, device=device)
        latest.index_copy_(0, to_device(fed_rows, torch.int64, device), fed_tokens)
    view = flat.view(-1)
    _repetition(view, vocab, seqs, [i for i in rows if seqs[i].params.repetition_penalty != 1.0], ahead, latest)
    _frequency_presence(view, vocab, seqs, [i for i in rows if seqs[i].params.frequency_penalty
                                            or seqs[i].params.presence_penalty], ahead, latest)
    if flat is not logits:
        logits.copy_(flat)


def _entries(per_row: list[np.ndarray], rows: list[int], vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """(flat logit positions ``row * vocab + id``, each entry's index in ``rows``) over every row's ids."""
    lengths = np.fromiter((len(ids) for ids in per_row), dtype=np.int64, count=len(per_row))
    which = np.repeat(np.arange(len(rows), dtype=np.int64), lengths)
    ids = np.concatenate(per_row) if per_row else np.empty(0, dtype=np.int64)
    return np.asarray(rows, dtype=np.int64)[which] * vocab + ids, which


def _repetition(view: torch.Tensor, vocab: int, seqs: list[Sequence], rows: list[int], ahead: set[int],
                latest: torch.Tensor | None) -> None:
    if not rows:
        return
    device = view.device
    positions, which = _entries([_repetition_ids(seqs[i], i in ahead) for i in rows], rows, vocab)
    positions = array_to_device(positions, device)
    penalty = to_device([seqs[i].params.repetition_penalty for i in rows], torch.float32, device)
    entry_penalty = penalty.index_select(0, array_to_device(which, device))
    # a token in flight is covered unless the window is 0 tokens long (it then covers none)
    covered = [j for j, i in enumerate(rows) if i in ahead and seqs[i].params.repetition_window != 0]
    if covered:
        index = to_device(covered, torch.int64, device)
        batch_rows = to_device([rows[j] for j in covered], torch.int64, device)
        positions = torch.cat([positions, batch_rows * vocab + latest.index_select(0, batch_rows)])
        entry_penalty = torch.cat([entry_penalty, penalty.index_select(0, index)])
    if positions.numel() == 0:
        return
    x = view.index_select(0, positions)
    # a position listed twice (a window's repeats, a token in flight it already holds) gets the same value twice
    view.index_copy_(0, positions, torch.where(x > 0, x / entry_penalty, x * entry_penalty).to(view.dtype))


def _frequency_presence(view: torch.Tensor, vocab: int, seqs: list[Sequence], rows: list[int], ahead: set[int],
                        latest: torch.Tensor | None) -> None:
    if not rows:
        return
    device, dtype = view.device, view.dtype
    ids, counts = [], []
    for i in rows:
        output = _counts_of(seqs[i]).output
        output.catch_up(seqs[i].output_token_ids)
        ids.append(output.ids[:output.size])
        counts.append(output.counts[:output.size])
    positions, which = _entries(ids, rows, vocab)
    positions = array_to_device(positions, device)
    which = array_to_device(which, device)
    count = array_to_device(np.concatenate(counts).astype(np.int64), device)
    weights = to_device([[seqs[i].params.frequency_penalty, seqs[i].params.presence_penalty] for i in rows], dtype,
                        device)
    pending = [j for j, i in enumerate(rows) if i in ahead]
    if pending:            # the token in flight adds one to its id's count, or is a new id with a count of one
        batch_rows = to_device(rows, torch.int64, device)
        token = latest.index_select(0, batch_rows)                     # per row of ``rows``; -1 where none
        match = (positions - batch_rows.index_select(0, which) * vocab) == token.index_select(0, which)
        before = torch.zeros(len(rows), dtype=torch.int64, device=device).index_add_(0, which, count * match)
        count = count + match
        index = to_device(pending, torch.int64, device)
        positions = torch.cat([positions, batch_rows.index_select(0, index) * vocab + token.index_select(0, index)])
        count = torch.cat([count, before.index_select(0, index) + 1])
        which = torch.cat([which, index])
    if positions.numel() == 0:
        return
    x = view.index_select(0, positions)
    c = count.to(dtype)
    w = weights.index_select(0, which)
    view.index_copy_(0, positions, x - (w[:, 0] * c + w[:, 1] * (c > 0).to(dtype)))
