"""The batched sampler against a plain per-row reference: seeded rows with every kind of parameter,
sampled together, choose what each chooses alone, with the same logprobs."""
import pytest
import torch

from gh200rt.engine.sampler import Sampler
from gh200rt.sampling_params import SamplingParams
from gh200rt.scheduler.request import Sequence

VOCAB = 97
ROW_PARAMS = [
    dict(temperature=0),
    dict(temperature=0, repetition_penalty=1.7, logprobs=3),
    dict(temperature=0.8, top_k=5),
    dict(temperature=1.2, top_p=0.6, logprobs=0),
    dict(temperature=1.0, min_p=0.2, frequency_penalty=0.4, presence_penalty=0.3),
    dict(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05, repetition_penalty=1.3, logprobs=5),
    dict(temperature=1.0, min_tokens=4, stop_token_ids=[3, 4]),
    dict(temperature=0, min_tokens=4, stop_token_ids=[7], logprobs=1),
]


def make_seq(i: int, params: dict) -> Sequence:
    seq = Sequence(f"s{i}", f"g{i}", 0, [1, 2, 3, 9, 9], SamplingParams(seed=100 + i, **params), i,
                   frozenset({0}))
    for t in (5, 5, 11):
        seq.append_token(t)
    return seq


def reference_row(row: torch.Tensor, seq: Sequence, generator: torch.Generator) -> int:
    """The per-row order of operations, one row at a time."""
    p = seq.params
    row = row.clone()
    if len(seq.output_token_ids) < p.min_tokens:
        row[sorted(set(p.stop_token_ids) | set(seq.eos_token_ids))] = float("-inf")
    if p.repetition_penalty != 1.0:
        seen = sorted(set(seq.all_token_ids))
        vals = row[seen]
        row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    counts = torch.bincount(torch.tensor(seq.output_token_ids, device=row.device), minlength=VOCAB).float()
    row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).float()
    if p.greedy:
        return int(row.argmax())
    row /= p.temperature
    if p.top_k:
        row[row < torch.topk(row, p.top_k).values[-1]] = float("-inf")
    if p.top_p < 1.0:
        sorted_row, order = torch.sort(row, descending=True)
        probs = torch.softmax(sorted_row, -1)
        row[order[(torch.cumsum(probs, -1) - probs) >= p.top_p]] = float("-inf")
    if p.min_p:
        probs = torch.softmax(row, -1)
        row[probs < p.min_p * probs.max()] = float("-inf")
    probs = torch.softmax(row, -1)
    return int(torch.argmax(probs / torch.empty_like(probs).exponential_(generator=generator)))


@pytest.mark.parametrize("trial", range(5))
def test_batch_matches_rows_alone(trial):
    logits = torch.randn(len(ROW_PARAMS), VOCAB, generator=torch.Generator().manual_seed(trial)) * 3
    seqs = [make_seq(i, p) for i, p in enumerate(ROW_PARAMS)]
    result = Sampler(seed=trial)(logits, seqs)
    for i, seq in enumerate(seqs):
        gen = torch.Generator().manual_seed(make_seq(i, ROW_PARAMS[i]).seed)
        assert result.token_ids[i] == reference_row(logits[i], seq, gen), ROW_PARAMS[i]
        k = seq.params.logprobs
        if k is None:
            assert result.logprobs[i] is None
            continue
        raw = torch.log_softmax(logits[i], -1)
        chosen = result.token_ids[i]
        expected_top = torch.topk(raw, k).indices.tolist() if k else []
        assert set(result.logprobs[i]) == set(expected_top) | {chosen}
        assert result.logprobs[i][chosen].rank == int((raw > raw[chosen]).sum()) + 1
        assert result.chosen_logprobs[i] == pytest.approx(raw[chosen].item(), rel=1e-6)


def test_stop_ids_stay_masked_until_min_tokens():
    logits = torch.full((1, VOCAB), -5.0)
    logits[0, 3] = 10.0
    seq = make_seq(0, dict(temperature=1.0, min_tokens=10, stop_token_ids=[3]))
    assert all(Sampler(seed=s)(logits, [seq]).token_ids[0] != 3 for s in range(10))
