"""Verification's rejection sampling emits tokens distributed as the target's own samples (chi-square over
thousands of draws on a six-token vocabulary, after temperature and top-k), whatever the drafts; the greedy rule
keeps exactly the drafts that equal each row's argmax."""
import torch

from gh200rt.engine.sampler import Sampler
from gh200rt.sampling_params import SamplingParams
from gh200rt.scheduler.request import Sequence
from gh200rt.speculative.verify import launch_verification

V = 6
ROWS = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, 0.3],      # position 0
                     [0.1, 0.2, 2.5, 0.4, 0.0, -0.5],      # after the first draft
                     [1.0, 1.0, 1.0, 1.0, 3.0, 0.0]])      # after the second
CRITICAL_DF5 = 20.52         # chi-square, 5 degrees of freedom, p = 0.001


def seqs(count: int, params: SamplingParams) -> list[Sequence]:
    return [Sequence(f"r{i}#0", f"r{i}", 0, [1, 2, 3], params, arrival=i) for i in range(count)]


def target(row: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    scaled = row / params.temperature
    if params.top_k:
        scaled = scaled.masked_fill(scaled < scaled.topk(params.top_k).values[-1], float("-inf"))
    return torch.softmax(scaled, dim=-1)


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    seen = expected > 0
    assert counts[~seen].sum() == 0, "a token the target gives no probability was emitted"
    return float((((counts - expected)[seen]) ** 2 / expected[seen]).sum())


def draws(drafts: list[int], params: SamplingParams, total: int = 6000, batch: int = 1500):
    """(first emitted tokens, second emitted tokens where the first was the first draft) over ``total`` groups."""
    sampler = Sampler(seed=1234)
    firsts, seconds, emitted_all = [], [], []
    for _ in range(total // batch):
        group = [(seq, list(drafts)) for seq in seqs(batch, params)]
        logits = ROWS[:len(drafts) + 1].repeat(batch, 1)
        result = launch_verification(sampler, logits, group).result()
        width = len(drafts) + 1
        for g, emitted in enumerate(result.emitted):
            tokens = result.token_ids[g * width:g * width + emitted]
            emitted_all.append(emitted)
            firsts.append(tokens[0])
            if len(tokens) > 1 and tokens[0] == drafts[0]:
                seconds.append(tokens[1])
    return torch.tensor(firsts), torch.tensor(seconds), emitted_all


def test_emitted_tokens_follow_the_target_distribution():
    params = SamplingParams(temperature=0.8, top_k=4)
    p0, p1 = target(ROWS[0], params), target(ROWS[1], params)
    for drafts in ([0, 2], [5, 1], [3, 3]):          # likely, unlikely and excluded-by-top-k drafts
        firsts, seconds, emitted = draws(drafts, params)
        assert chi_square(torch.bincount(firsts, minlength=V).double(), p0.double()) < CRITICAL_DF5, drafts
        if drafts[0] == 0:                           # kept often: the second position's tokens are p1's
            assert len(seconds) > 1000
            assert chi_square(torch.bincount(seconds, minlength=V).double(), p1.double()) < CRITICAL_DF5
        # a draft the target gives probability p is kept in about p of the draws
        kept = sum(e > 1 for e in emitted) / len(emitted)
        assert abs(kept - float(p0[drafts[0]])) < 0.03, (drafts, kept, float(p0[drafts[0]]))


def test_a_wrong_residual_would_be_seen():
    """The check above can fail: tokens drawn from p itself after a rejection (the draft not removed) are too often
    the draft."""
    params = SamplingParams(temperature=1.0)
    p0 = target(ROWS[0], params)
    generator = torch.Generator().manual_seed(0)
    n = 6000
    u = torch.rand(n, generator=generator)
    redraw = torch.multinomial(p0, n, replacement=True, generator=generator)
    biased = torch.where(u <= p0[0], 0, redraw)          # accept draft 0 with p0(0), else draw from p0 again
    assert chi_square(torch.bincount(biased, minlength=V).double(), p0.double()) > CRITICAL_DF5


def test_greedy_keeps_drafts_while_they_are_the_argmax():
    params = SamplingParams(temperature=0)
    cases = {(0, 2): ([0, 2, 4], 3), (0, 1): ([0, 2], 2), (3, 2): ([0], 1), (): ([0], 1)}
    for drafts, (want, emitted) in cases.items():
        seq = seqs(1, params)[0]
        result = launch_verification(Sampler(), ROWS[:len(drafts) + 1].clone(), [(seq, list(drafts))]).result()
        assert result.emitted == [emitted]
        assert result.token_ids[:emitted] == want, drafts


def test_seeded_sequences_repeat_their_draws():
    params = SamplingParams(temperature=1.0, seed=7)
    runs = []
    for _ in range(2):
        group = [(seq, [1, 2]) for seq in seqs(64, params)]
        result = launch_verification(Sampler(seed=99), ROWS.repeat(64, 1), group).result()
        runs.append((result.token_ids, result.emitted))
    assert runs[0] == runs[1]


def test_a_draft_models_drafts_are_corrected_to_the_target():
    """Drafts drawn from a draft model's own distributions q: kept with min(1, p / q), else replaced from
    max(p - q, 0); the emitted tokens are still p's."""
    params = SamplingParams(temperature=1.0)
    p0, p1 = target(ROWS[0], params), target(ROWS[1], params)
    q = torch.tensor([[0.05, 0.05, 0.4, 0.3, 0.1, 0.1], [0.3, 0.1, 0.1, 0.1, 0.2, 0.2]])
    generator = torch.Generator().manual_seed(3)
    sampler = Sampler(seed=5)
    firsts, seconds, batch = [], [], 1500
    for _ in range(4):
        group = []
        drafted = torch.stack([torch.multinomial(q[0], batch, True, generator=generator),
                               torch.multinomial(q[1], batch, True, generator=generator)], dim=1).tolist()
        for seq, drafts in zip(seqs(batch, params), drafted):
            seq.spec_draft_probs = q
            group.append((seq, drafts))
        result = launch_verification(sampler, ROWS.repeat(batch, 1), group).result()
        for g, ((_, drafts), emitted) in enumerate(zip(group, result.emitted)):
            tokens = result.token_ids[g * 3:g * 3 + emitted]
            firsts.append(tokens[0])
            if len(tokens) > 1:
                assert tokens[0] == drafts[0]
                seconds.append(tokens[1])
    assert chi_square(torch.bincount(torch.tensor(firsts), minlength=V).double(), p0.double()) < CRITICAL_DF5
    assert len(seconds) > 1000
    assert chi_square(torch.bincount(torch.tensor(seconds), minlength=V).double(), p1.double()) < CRITICAL_DF5
