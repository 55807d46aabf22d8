import math

import torch

from gh200rt.engine.sampler import Sampler, greedy_tokens, truncate
from gh200rt.sampling_params import SamplingParams
from gh200rt.scheduler.request import Sequence


def seq(prompt=(1,), outputs=(), index=0, eos=frozenset(), **params):
    s = Sequence("s", "g", index, list(prompt), SamplingParams(**params), 0, eos)
    for t in outputs:
        s.append_token(t)
    return s


def test_greedy_takes_argmax():
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, 0.0, 1.0]])
    r = Sampler()(logits, [seq(temperature=0), seq(temperature=0)])
    assert r.token_ids == [1, 0]


def test_greedy_tokens_pick_argmax_s_index_on_ties_nan_and_masked_rows():
    """The CPU's ``max`` route takes the first maximum and a NaN before any number, as ``argmax`` does."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randint(0, 3, (64, 4096), generator=gen).float()       # many ties in every row
    logits[torch.rand(64, 4096, generator=gen) < 1e-3] = float("nan")
    logits[5] = -float("inf")
    logits[6, 7:] = -float("inf")
    for dtype in (torch.float32, torch.bfloat16):
        x = logits.to(dtype)
        assert torch.equal(greedy_tokens(x), torch.argmax(x, dim=-1)), dtype


def test_repetition_presence_frequency_penalties():
    logits = torch.tensor([[2.0, 1.9, -1.0]])
    assert Sampler()(logits.clone(), [seq(prompt=[0], temperature=0, repetition_penalty=2.0)]).token_ids == [1]
    s = seq(outputs=[0, 0], temperature=0, frequency_penalty=0.1)   # 2.0 - 0.2 < 1.9
    assert Sampler()(logits.clone(), [s]).token_ids == [1]
    s = seq(outputs=[0], temperature=0, presence_penalty=0.05)       # 1.95 > 1.9
    assert Sampler()(logits.clone(), [s]).token_ids == [0]


def test_min_tokens_masks_eos_and_stop_ids():
    logits = torch.tensor([[9.0, 1.0, 8.0]])
    s = seq(temperature=0, min_tokens=1, stop_token_ids=[2], eos=frozenset({0}))
    assert Sampler()(logits, [s]).token_ids == [1]


def test_truncation_top_k_top_p_min_p():
    row = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    r = row.clone(); truncate(r, 2, 1.0, 0.0)
    assert torch.isinf(r).tolist() == [False, False, True, True]
    r = row.clone(); truncate(r, 0, 0.8, 0.0)
    assert torch.isinf(r).tolist() == [False, False, True, True]
    r = row.clone(); truncate(r, 0, 0.81, 0.0)
    assert torch.isinf(r).tolist() == [False, False, False, True]
    r = row.clone(); truncate(r, 0, 1.0, 0.5)                         # keep p >= 0.25
    assert torch.isinf(r).tolist() == [False, False, True, True]


def test_temperature_sampling_matches_distribution():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).repeat(4000, 1)
    seqs = [seq(temperature=1.0) for _ in range(4000)]
    counts = torch.bincount(torch.tensor(Sampler(seed=1)(logits, seqs).token_ids), minlength=3).float() / 4000
    assert torch.allclose(counts, torch.tensor([0.7, 0.2, 0.1]), atol=0.03), counts


def test_seeded_rows_do_not_depend_on_batch():
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    alone = [Sampler(seed=5)(logits[i:i + 1], [seq(seed=99, index=i % 2, temperature=0.9)]).token_ids[0]
             for i in range(3)]
    # A fresh sequence per call (same seed) gives the same first draw whatever sits next to it.
    mixed = Sampler(seed=6)(logits[:3].clone(), [seq(seed=99, index=i % 2, temperature=0.9) for i in range(3)])
    assert mixed.token_ids == alone


def test_logprobs_hold_topk_and_chosen_with_rank():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    r = Sampler()(logits, [seq(temperature=0, logprobs=2, min_tokens=0)])
    lp = r.logprobs[0]
    expected = torch.log_softmax(logits[0], -1)
    assert set(lp) == {1, 2}
    assert lp[1].rank == 1 and lp[2].rank == 2
    assert math.isclose(lp[2].logprob, expected[2].item(), rel_tol=1e-6)
    assert math.isclose(r.chosen_logprobs[0], expected[1].item(), rel_tol=1e-6)


def test_allowed_token_ids_restrict_sampling_row_by_row():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [1.0, 3.0, 2.0, 0.0]])
    r = Sampler()(logits.clone(), [seq(temperature=0, allowed_token_ids=[3]), seq(temperature=0)])
    assert r.token_ids == [3, 1]                  # the least likely token, because it is the only one allowed
    drawn = {Sampler(seed=s)(logits[:1].clone(), [seq(temperature=1.0, allowed_token_ids=[0, 2])]).token_ids[0]
             for s in range(20)}
    assert drawn <= {0, 2} and len(drawn) == 2


def test_logprob_token_ids_report_exactly_those_ids_and_the_chosen_one():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [1.0, 3.0, 2.0, 0.0]])
    r = Sampler()(logits, [seq(temperature=0, logprobs=3, logprob_token_ids=[3, 0]), seq(temperature=0, logprobs=3)])
    expected = torch.log_softmax(logits[0], -1)
    pinned = r.logprobs[0]
    assert set(pinned) == {3, 0, 1}               # the pinned ids, and the sampled token 1; no top-k
    assert pinned[3].rank == 4 and pinned[0].rank == 3 and pinned[1].rank == 1
    assert math.isclose(pinned[3].logprob, expected[3].item(), rel_tol=1e-6)
    assert set(r.logprobs[1]) == {1, 2, 0}        # the other row still gets its top 3
