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
    cdf = torch.cumsum(torch.softmax(row, -1), -1)
    u = 1.0 - torch.zeros(1, device=row.device).uniform_(generator=generator)
    return min(int(torch.searchsorted(cdf, u * cdf[-1:])), row.shape[0] - 1)


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


@pytest.mark.parametrize("with_top_p", [True, False], ids=["top-k and top-p", "top-k alone"])
@pytest.mark.parametrize("scale", [0.05, 1.0, 4.0, 12.0], ids=["nearly uniform", "flat", "peaked", "very peaked"])
def test_window_truncation_equals_the_full_sort(scale, with_top_p):
    """The CPU's top-k / top-p over each row's largest logits (a wider window, then a sort, where the window
    holds too little mass; top-k alone over the batch's largest k) keeps exactly what a sort of the whole
    vocabulary keeps."""
    from gh200rt.engine import sampler as sampler_module
    from gh200rt.engine.sampling_tensors import SamplingTensors
    rows, vocab = 24, 10_000
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(1)) * scale
    logits[3, :60] = 2.5           # ties at the k-th value stay
    top_k = torch.tensor([[0, 5, 40, 256, 0, 1][i % 6] for i in range(rows)])
    top_p = torch.tensor([[0.9, 1.0, 0.5, 0.95, 0.99, 0.3][i % 6] if with_top_p else 1.0 for i in range(rows)])
    t = SamplingTensors(torch.arange(rows), torch.ones(rows, 1), top_k, top_p, torch.zeros(rows), True, with_top_p,
                        False, int(top_k.max()))
    window = sampler_module.truncate_batch(logits.clone(), t)
    full = sampler_module._sorted_top_k_top_p(logits.clone(), t)
    assert torch.equal(torch.isinf(window), torch.isinf(full))
    assert torch.equal(window[~torch.isinf(window)], logits[~torch.isinf(window)])


def test_draws_never_pick_excluded_tokens_and_follow_the_distribution():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.2, 0.0])
    logits = torch.log(probs).repeat(6000, 1)
    seqs = [Sequence(f"s{i}", "g", 0, [1], SamplingParams(temperature=1.0), i) for i in range(6000)]
    ids = torch.tensor(Sampler(seed=3)(logits, seqs).token_ids)
    freq = torch.bincount(ids, minlength=6).float() / 6000
    assert freq[[0, 2, 5]].sum() == 0
    assert torch.allclose(freq, probs, atol=0.025), freq


@pytest.mark.parametrize("trial", range(3))
def test_a_token_in_flight_counts_as_the_host_would_count_it(trial):
    """A step launched ahead (engine/run_ahead.py) samples rows whose latest output token is on the device only
    (``fed``): penalties, windows and min_tokens must treat it exactly as the host would once appended."""
    from gh200rt.engine.penalties import apply_penalties
    from gh200rt.engine.sampling_tensors import banned_until_min_tokens
    rows = ROW_PARAMS + [dict(temperature=0, repetition_penalty=1.5, repetition_window=3),
                         dict(temperature=0, repetition_penalty=1.5, repetition_window=1, frequency_penalty=0.7),
                         dict(temperature=0, repetition_penalty=2.0, repetition_window=0),
                         dict(temperature=0, min_tokens=4, stop_token_ids=[8], presence_penalty=1.1),
                         dict(temperature=0, repetition_penalty=1.2, frequency_penalty=0.5)]
    g = torch.Generator().manual_seed(trial)
    logits = torch.randn(len(rows), VOCAB, generator=g) * 3
    # in flight: a token new to the row (row 0 mod 3), one the row holds (5: its first output), or one its prompt has
    in_flight = torch.tensor([(40 + i, 5, 2)[i % 3] for i in range(len(rows))])
    fed = [i for i in range(len(rows)) if i not in (1, len(rows) - 1)]    # rows 1 and the last: prompts, none
    appended = [make_seq(i, p) for i, p in enumerate(rows)]
    for i in fed:
        appended[i].append_token(int(in_flight[i]))
    ahead = [make_seq(i, p) for i, p in enumerate(rows)]
    penalised = list(range(len(rows)))
    want, got = logits.clone(), logits.clone()
    apply_penalties(want, appended, penalised)
    apply_penalties(got, ahead, penalised, (fed, in_flight[fed]))
    assert torch.equal(got, want)
    assert [banned_until_min_tokens(s, i in fed) for i, s in enumerate(ahead)] == \
        [banned_until_min_tokens(s) for s in appended]
    assert any(banned_until_min_tokens(s) != banned_until_min_tokens(t) for s, t in zip(appended, ahead))
    result = Sampler(seed=trial).launch(logits.clone(), ahead, (fed, in_flight[fed])).result()
    assert result.token_ids == Sampler(seed=trial).launch(logits.clone(), appended).result().token_ids


def test_fed_ids_land_in_their_places_among_the_inputs():
    from gh200rt.engine.run_ahead import FedTokens
    sampled = torch.tensor([70, 71, 72, 73])
    inputs = torch.arange(10)
    FedTokens(sampled, [3, 0], [2, 7], [1, 3]).write_into(inputs)
    assert inputs.tolist() == [0, 1, 73, 3, 4, 5, 6, 70, 8, 9]
    inputs = torch.arange(10)
    fed = FedTokens(sampled, [0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3])
    fed.write_into(inputs)
    assert inputs.tolist() == [70, 71, 72, 73, 4, 5, 6, 7, 8, 9] and fed.ids() is sampled


def test_rows_reporting_logprobs_among_rows_that_do_not_get_what_each_gets_alone():
    # the raw logprobs are taken of the reporting rows only: a pinned row's ids must be read from its own row there
    params = [dict(temperature=0), dict(temperature=0, logprobs=0, logprob_token_ids=[4, 60]), dict(temperature=0),
              dict(temperature=0.8, logprobs=2), dict(temperature=0, logprobs=0, logprob_token_ids=[7])]
    logits = torch.randn(len(params), VOCAB, generator=torch.Generator().manual_seed(11)) * 3
    together = Sampler(seed=0).launch(logits.clone(), [make_seq(i, p) for i, p in enumerate(params)]).result()
    for i, p in enumerate(params):
        alone = Sampler(seed=0).launch(logits[i:i + 1].clone(), [make_seq(i, p)]).result()
        assert together.token_ids[i] == alone.token_ids[0]
        assert together.logprobs[i] == alone.logprobs[0], p
    assert set(together.logprobs[1]) >= {4, 60} and set(together.logprobs[4]) >= {7}
