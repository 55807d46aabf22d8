"""Verify drafted tokens against the target model's distribution, for a whole step at once on the logits' device.

A sequence that drafted ``d_0 .. d_{k-1}`` has k + 1 logits rows in the step: row j is the target's next-token
distribution after the first j drafts. Each row is processed exactly as the sampler processes a row (logit bias,
allowed ids, bad words, the grammar's mask, min_tokens, penalties, then temperature / top-k / top-p / min-p), with
the sequence's output taken to be its output so far plus the j drafts before it (``PositionView``), so a verified
position sees what it would have seen had the drafts been sampled one by one.

* Greedy rows keep drafts while each equals the row's argmax; the first row where they differ (or row k) gives its
  argmax: exactly the tokens greedy decoding gives.
* Random rows keep ``d_j`` with probability ``min(1, p_j(d_j) / q_j(d_j))``; n-gram drafts are a point mass
  (``q = 1`` at the draft), so the test is ``u <= p_j(d_j)``. The first rejected row draws from the residual
  ``max(p_j - q_j, 0)`` (the point mass removed: ``p_j`` without ``d_j``), and a sequence whose drafts were all kept
  draws a bonus token from row k. The emitted tokens are then distributed as the target's own samples (the
  standard speculative-sampling argument), which ``tests/speculative/test_rejection_sampling.py`` checks by
  chi-square. A sequence's random numbers are one per row (row j < k's tests its draft, row k's draws the emitted
  token), so a sequence that drafted nothing draws exactly as the sampler does.

Logprobs are the target's raw ones (log-softmax of each row's logits before processing), as without speculation.
The result is one ``PendingSample`` over all rows, with the number of tokens each sequence emits beside the tokens
(one device -> host copy).
"""
from __future__ import annotations

import torch

from gh200rt.engine.device_inputs import to_device
from gh200rt.engine.logits_processors import allow_also, apply_logits_processors, unpack_bitmask
from gh200rt.engine.sampler import PendingSample, Sampler, apply_output_rules, draw, greedy_tokens, target_probs
from gh200rt.scheduler.request import Sequence

_NEVER = 1 << 30


class PositionView:
    """``seq`` as verified position j reads it: its output so far and the ``drafted`` tokens before the position.
    Has what the sampler's rules read of a sequence; its grammar is left to ``apply_draft_grammar_masks``."""
    __slots__ = ("seq", "params", "seed", "eos_token_ids", "output_token_ids", "all_token_ids", "penalty_counts",
                 "grammar", "is_finished")

    def __init__(self, seq: Sequence, drafted: list[int]):
        self.seq = seq
        self.params = seq.params
        self.seed = seq.seed
        self.eos_token_ids = seq.eos_token_ids
        self.output_token_ids = seq.output_token_ids + drafted if drafted else seq.output_token_ids
        self.all_token_ids = seq.all_token_ids + drafted if drafted else seq.all_token_ids
        # position 0's output is the sequence's own: its running counts serve (the others count their own)
        self.penalty_counts = None if drafted else seq.penalty_counts
        self.grammar = None
        self.is_finished = False

    def generator_on(self, device: torch.device) -> torch.Generator:
        return self.seq.generator_on(device)


def apply_draft_grammar_masks(logits: torch.Tensor, groups: list[tuple[Sequence, list[int]]],
                              starts: list[int]) -> None:
    """The grammar's mask at every verified position of each constrained sequence, in place: llguidance advances a
    matcher through the drafts, writes a mask per position, and rolls back (a rejected draft never advances it). Rows
    after a draft the grammar refuses are left unmasked: that draft's own row gives it no probability, so they are
    never reached."""
    constrained = [(g, seq.grammar) for g, (seq, _) in enumerate(groups)
                   if seq.grammar is not None and seq.grammar.masking and not seq.grammar.failed
                   and not seq.is_finished]
    if not constrained:
        return
    vocab = logits.shape[1]
    words = (vocab + 31) // 32
    rows: list[int] = []
    with_drafts, without = [], []
    for g, grammar in constrained:
        drafts = groups[g][1]
        if drafts:
            with_drafts.append((grammar.matcher, len(rows), list(drafts)))
        else:
            without.append((grammar.matcher, len(rows)))
        rows.extend(range(starts[g], starts[g] + len(drafts) + 1))
    bitmask = torch.full((len(rows), words), -1, dtype=torch.int32, pin_memory=logits.device.type == "cuda")
    executor = constrained[0][1].executor
    if with_drafts:
        executor.unsafe_compute_mask_ptr_with_draft_token(with_drafts, bitmask.data_ptr(), words * 4, len(rows))
    if without:
        executor.unsafe_compute_mask_ptr(without, bitmask.data_ptr(), words * 4, len(rows))
    index = to_device(rows, torch.int64, logits.device)
    allowed = unpack_bitmask(bitmask.to(logits.device, non_blocking=True), vocab)
    # a gated grammar drafts nothing before its answer (speculator.propose): its one row is its first
    allow_also(allowed, [extra for g, grammar in constrained
                         for extra in [grammar.also_allowed] + [None] * len(groups[g][1])])
    logits[index] = logits[index].masked_fill(~allowed, float("-inf"))


def draft_distributions(views: list[PositionView], random_rows: list[int], groups, starts: list[int],
                        draft: torch.Tensor, vocab: int) -> torch.Tensor:
    """[len(random_rows), V]: the distribution each random row's draft was drawn from (a draft model's row, or a
    point mass at the draft); zero on a last row, which holds no draft."""
    device = draft.device
    q = torch.zeros(len(random_rows), vocab, device=device)
    where = {id(seq): g for g, (seq, _) in enumerate(groups)}
    point = []
    for j, i in enumerate(random_rows):
        seq = views[i].seq
        g = where[id(seq)]
        position = i - starts[g]
        if position >= len(groups[g][1]):
            continue
        if seq.spec_draft_probs is not None:
            q[j] = seq.spec_draft_probs[position]
        else:
            point.append(j)
    if point:
        index = torch.tensor(point, device=device)
        rows = torch.tensor(random_rows, device=device).index_select(0, index)
        q.index_put_((index, draft.index_select(0, rows)), torch.ones(len(point), device=device))
    return q


@torch.inference_mode()       # the model's logits are inference tensors: the processors update them in place
def launch_verification(sampler: Sampler, logits: torch.Tensor,
                        groups: list[tuple[Sequence, list[int]]]) -> PendingSample:
    """Verify every group's drafts (``groups``: (sequence, its drafted tokens) in row order; ``logits``: [sum of
    (drafts + 1), V]). A sequence's ``spec_draft_probs`` ([>= drafts, V], a draft model's) are the distributions its
    drafts were drawn from; without them a draft is a point mass. Row r of the result's tokens is the token emitted
    at that position where the sequence gets that far; ``emitted[g]`` (1 to k + 1) is how many group g emits."""
    device = logits.device
    views: list[PositionView] = []
    starts: list[int] = []
    draft_rows: list[int] = []
    is_draft: list[bool] = []
    group_of: list[int] = []
    position: list[int] = []
    for g, (seq, drafts) in enumerate(groups):
        starts.append(len(views))
        for j in range(len(drafts) + 1):
            views.append(PositionView(seq, drafts[:j]))
            draft_rows.append(drafts[j] if j < len(drafts) else 0)
            is_draft.append(j < len(drafts))
            group_of.append(g)
            position.append(j)
    assert logits.shape[0] == len(views), "one logits row per verified position"
    want = [i for i, v in enumerate(views) if v.params.logprobs is not None]
    raw_logprobs = None
    if want:
        rows = logits if len(want) == len(views) else logits.index_select(0, to_device(want, torch.int64, device))
        raw_logprobs = torch.log_softmax(rows, dim=-1)
    apply_logits_processors(logits, views)
    apply_draft_grammar_masks(logits, groups, starts)
    processed = logits.clone()
    apply_output_rules(processed, views)
    for g, (seq, _) in enumerate(groups):
        seq.penalty_counts = views[starts[g]].penalty_counts
    pad = [0] * (len(views) - len(groups))
    facts = to_device([draft_rows, [int(d) for d in is_draft], group_of, position, starts + pad,
                       [s + len(drafts) for s, (_, drafts) in zip(starts, groups)] + pad], torch.int64, device)
    draft, drafted, group, pos = facts[0], facts[1].bool(), facts[2], facts[3]
    start, last = facts[4][:len(groups)], facts[5][:len(groups)]
    target = greedy_tokens(processed)
    accepted = (target == draft) & drafted                      # the greedy rule, for every row
    random_rows = [i for i, v in enumerate(views) if not v.params.greedy]
    probs = u = None
    if random_rows:
        t, probs = target_probs(processed, views, random_rows)
        u = sampler.uniforms(views, random_rows, device)       # a draft row's tests its draft, a last row's draws
        q = draft_distributions(views, random_rows, groups, starts, draft, probs.shape[1])
        d = draft.index_select(0, t.random_rows).unsqueeze(1)
        ratio = probs.gather(1, d).squeeze(1) / q.gather(1, d).squeeze(1).clamp_min(1e-30)
        accepted.index_copy_(0, t.random_rows, (u <= ratio) & drafted.index_select(0, t.random_rows))
    # the first row of each group whose draft is not kept (row k, which holds none, at the latest)
    first_rejected = torch.full((len(groups),), _NEVER, dtype=torch.int64, device=device).scatter_reduce_(
        0, group, torch.where(accepted, _NEVER, pos), "amin")
    final_row = start + first_rejected
    final = target.index_select(0, final_row)
    if random_rows:
        in_random = torch.full((len(views),), -1, dtype=torch.int64, device=device)
        in_random.index_copy_(0, t.random_rows, torch.arange(len(random_rows), device=device))
        which = in_random.index_select(0, final_row)
        random_groups = (which >= 0).nonzero().squeeze(1)
        if random_groups.numel():
            rows = which.index_select(0, random_groups)
            rows_final = final_row.index_select(0, random_groups)
            dist = probs.index_select(0, rows)
            rejected = drafted.index_select(0, rows_final).unsqueeze(1)
            residual = (dist - q.index_select(0, rows)).clamp_min_(0.0)
            # p(d) = 1 is always kept, so a residual has mass; a rounding that empties it falls back to p
            dist = torch.where(rejected & (residual.sum(dim=1, keepdim=True) > 0), residual, dist)
            draw_u = u.index_select(0, in_random.index_select(0, last.index_select(0, random_groups)))
            final.index_copy_(0, random_groups, draw(dist, draw_u))
    tokens = torch.where(drafted, draft, 0).index_copy_(0, final_row, final)
    return PendingSample.launch(tokens, raw_logprobs, views, want, emitted=first_rejected + 1)
