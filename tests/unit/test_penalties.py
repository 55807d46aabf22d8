"""Penalties applied at the ids that occurred (engine/penalties.py) against the dense formulas over a [rows, vocab]
count table (the implementation before, kept here as the reference): the same bits at every step of a growing
output, with windows, tokens in flight and neutral rows mixed in."""
import random

import pytest
import torch

from gh200rt.engine.device_inputs import to_device
from gh200rt.engine.penalties import TokenCounts, apply_penalties
from gh200rt.engine.sampling_tensors import padded_ids
from gh200rt.sampling_params import SamplingParams
from gh200rt.scheduler.request import Sequence

VOCAB = 97


def id_counts(rows, vocab, device, dtype):
    index = padded_ids(rows, vocab, device)
    counts = torch.zeros(len(rows), vocab + 1, dtype=dtype, device=device)
    counts.scatter_add_(1, index, torch.ones_like(index, dtype=dtype))
    return counts[:, :vocab]


def count_in_flight(counts, tokens):
    present = (tokens >= 0).to(counts.dtype).unsqueeze(1)
    return counts.scatter_add(1, tokens.clamp(min=0).unsqueeze(1), present)


def penalised_ids(seq, in_flight=False):
    ids, window = seq.all_token_ids, seq.params.repetition_window
    if window is None:
        return ids
    window = max(0, window - in_flight)
    return ids[len(ids) - min(window, len(ids)):]


def reference_penalties(logits, seqs, rows, in_flight=None):
    """The dense formulas: every row's history counted into [rows, vocab] tables each call."""
    device, vocab = logits.device, logits.shape[1]
    index = to_device(rows, torch.int64, device)
    sub = logits.index_select(0, index)
    params = [seqs[i].params for i in rows]
    ahead = set(in_flight[0]) if in_flight is not None else set()
    pending = [i in ahead for i in rows]
    if any(pending):
        fed_rows, fed_tokens = in_flight
        every = torch.full((logits.shape[0],), -1, dtype=torch.int64, device=device)
        every.index_copy_(0, to_device(fed_rows, torch.int64, device), fed_tokens)
        latest = every.index_select(0, index)
    if any(p.repetition_penalty != 1.0 for p in params):
        counts = id_counts([penalised_ids(seqs[i], a) for i, a in zip(rows, pending)], vocab, device, torch.int32)
        if any(pending):
            covered = to_device([p.repetition_window != 0 for p in params], torch.bool, device)
            counts = count_in_flight(counts, torch.where(covered, latest, -1))
        penalty = to_device([p.repetition_penalty for p in params], torch.float32, device).unsqueeze(1)
        sub = torch.where(counts > 0, torch.where(sub > 0, sub / penalty, sub * penalty), sub)
    if any(p.presence_penalty or p.frequency_penalty for p in params):
        counts = id_counts([seqs[i].output_token_ids for i in rows], vocab, device, sub.dtype)
        if any(pending):
            counts = count_in_flight(counts, latest)
        weights = to_device([[p.frequency_penalty, p.presence_penalty] for p in params], sub.dtype, device)
        sub = sub - (weights[:, 0:1] * counts + weights[:, 1:2] * (counts > 0).to(sub.dtype))
    logits.index_copy_(0, index, sub)


ROWS = [dict(repetition_penalty=1.3), dict(frequency_penalty=0.4), dict(presence_penalty=-0.6),
        dict(repetition_penalty=0.8, frequency_penalty=0.5, presence_penalty=0.25),
        dict(repetition_penalty=1.5, repetition_window=3), dict(repetition_penalty=2.0, repetition_window=0),
        dict(repetition_penalty=1.2, repetition_window=1, frequency_penalty=0.7),
        dict(repetition_penalty=1.1, repetition_window=500), dict(temperature=0),
        dict(repetition_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0)]


def make_seq(i, params, rng):
    prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 12))]
    return Sequence(f"s{i}", "g", 0, prompt, SamplingParams(max_tokens=1000, **params), i)


@pytest.mark.parametrize("trial", range(4))
def test_penalties_at_the_ids_that_occurred_give_the_dense_formulas_bits(trial):
    rng = random.Random(trial)
    g = torch.Generator().manual_seed(trial)
    seqs = [make_seq(i, p, rng) for i, p in enumerate(ROWS)]
    rows = [i for i in range(len(seqs)) if rng.random() < 0.9]
    for step in range(25):       # the running counts catch up on one to three new tokens a step
        logits = torch.randn(len(seqs), VOCAB, generator=g) * 3
        logits[0, 5] = 0.0
        logits[1, 7] = float("-inf")
        want, got = logits.clone(), logits.clone()
        reference_penalties(want, seqs, rows)
        apply_penalties(got, seqs, rows)
        assert torch.equal(got, want), step
        assert torch.equal(torch.isinf(got), torch.isinf(want))
        for seq in seqs:
            for _ in range(rng.randrange(1, 4)):
                seq.append_token(rng.randrange(VOCAB))


@pytest.mark.parametrize("trial", range(4))
def test_a_token_in_flight_gives_the_dense_formulas_bits(trial):
    rng = random.Random(100 + trial)
    g = torch.Generator().manual_seed(trial)
    seqs = [make_seq(i, p, rng) for i, p in enumerate(ROWS)]
    for seq in seqs:
        for _ in range(rng.randrange(0, 6)):
            seq.append_token(rng.randrange(VOCAB))
    rows = list(range(len(seqs)))
    fed = [i for i in rows if i % 4 != 1]
    # per fed row: a token it never had, one its output holds, or one only its prompt holds
    picks = []
    for i in fed:
        kind = rng.randrange(3)
        held = seqs[i].output_token_ids or seqs[i].prompt_token_ids
        picks.append(VOCAB - 1 - i if kind == 0 else held[-1] if kind == 1 else seqs[i].prompt_token_ids[0])
    tokens = torch.tensor(picks)
    logits = torch.randn(len(seqs), VOCAB, generator=g) * 3
    want, got = logits.clone(), logits.clone()
    reference_penalties(want, seqs, rows, (fed, tokens))
    apply_penalties(got, seqs, rows, (fed, tokens))
    assert torch.equal(got, want)


def test_non_contiguous_logits_are_penalised_in_place():
    rng = random.Random(5)
    seqs = [make_seq(i, p, rng) for i, p in enumerate(ROWS)]
    base = torch.randn(VOCAB, len(seqs), generator=torch.Generator().manual_seed(5))
    want, got = base.t().clone(), base.clone().t()
    assert not got.is_contiguous()
    reference_penalties(want, seqs, list(range(len(seqs))))
    apply_penalties(got, seqs, list(range(len(seqs))))
    assert torch.equal(got, want)


def test_token_counts_keep_first_seen_order_and_grow():
    counts = TokenCounts()
    tokens = [3, 3, 9] + list(range(100, 140)) + [9]
    counts.catch_up(tokens[:2])
    counts.catch_up(tokens)
    assert counts.seen == len(tokens) and counts.size == 42
    assert counts.ids[:3].tolist() == [3, 9, 100] and counts.counts[:3].tolist() == [2, 2, 1]
    assert counts.counts[:counts.size].sum() == len(tokens)
