"""Async scheduling: launch step N+1 before step N's sampled tokens reach the host.

Step N+1 decodes, for each sequence that sampled in step N, the token N sampled. Only the device holds that token
yet, so the step's input ids are read from N's token tensor on the device (``FedTokens``), and the host detokenizes,
checks stop conditions and reports step N while N+1 runs: on a GPU the device no longer idles through the host's
per-step work. What the host learns late costs at most one discarded row: a sequence that stops on EOS, a stop
token or a stop string in step N is computed once more in N+1 and that row is dropped (its KV slot lies past its
last token, in a block that is never published: ``publish_full_blocks`` hashes known tokens only). A length stop
is known ahead: the sequence is left out of N+1.

``plan_run_ahead`` launches N+1 only where it is the step the synchronous scheduler would take next, so tokens do
not depend on the mode: the running sequences in order while the token budget lasts (a fed decode for each that
sampled in N, the rest of its prompt for one whose chunk did not end it, or a host-known decode for one the budget
left out of N), then waiting requests, with every new position fitting the KV pool without preempting. Sampling
reads the output so far: penalties and min_tokens count the token in flight on the device (``Sampler.launch``'s
``in_flight``); where a grammar's mask or bad words read it on the host, the step's model runs ahead and its
sampling is launched once the previous step is taken in. A seeded or greedy sequence gets the same tokens as
without async scheduling; an unseeded random one draws from the engine's generator, whose stream a discarded row
shifts.
"""
from __future__ import annotations

import torch

from gh200rt.engine.device_inputs import to_device
from gh200rt.kv.kv_manager import KVCacheManager
from gh200rt.scheduler.request import Sequence
from gh200rt.scheduler.scheduler import ScheduledSequence, Scheduler, SchedulerOutput


class FedTokens:
    """The input ids a step reads on the device: fed row j takes ``source[index[j]]`` (the previous step's sampled
    tokens), at ``positions[j]`` among the step's input ids and ``sample_rows[j]`` among its sampling rows; every
    other input id (a prompt's) comes from the host."""

    def __init__(self, source: torch.Tensor, index: list[int], positions: list[int], sample_rows: list[int]):
        self.source, self.index, self.positions, self.sample_rows = source, index, positions, sample_rows
        self._ids: torch.Tensor | None = None

    def ids(self) -> torch.Tensor:
        """int64 [len(index)] on the device (gathered once: the inputs and the sampler's penalties read them)."""
        if self._ids is None:
            same = self.index == list(range(self.source.shape[0]))
            self._ids = self.source if same else \
                self.source.index_select(0, to_device(self.index, torch.int64, self.source.device))
        return self._ids

    def write_into(self, input_ids: torch.Tensor) -> None:
        """Put the fed ids in their places of ``input_ids`` (after the host's ids, in stream order)."""
        n = len(self.positions)
        if self.positions == list(range(n)):
            input_ids[:n].copy_(self.ids())
        else:
            input_ids.index_copy_(0, to_device(self.positions, torch.int64, input_ids.device), self.ids())

    def in_flight(self) -> tuple[list[int], torch.Tensor]:
        """(sampling rows, their tokens on the device): what penalties and min_tokens count as each row's latest."""
        return self.sample_rows, self.ids()


def reads_its_output_on_the_host(seq: Sequence) -> bool:
    """Whether ``seq``'s sampling reads its output so far on the host (a structured-output grammar's mask, bad
    words): a step launched ahead samples such a row only once the token in flight is appended."""
    return seq.grammar is not None or bool(seq.params.bad_words_token_ids)


def stops_on_length(seq: Sequence) -> bool:
    """Whether the token in flight, once appended, ends ``seq`` by max_tokens or the context limit."""
    p = seq.params
    return ((p.max_tokens is not None and len(seq.output_token_ids) + 1 >= p.max_tokens)
            or seq.num_tokens + 1 >= seq.max_model_len)


def plan_run_ahead(previous: SchedulerOutput, sampled: list[Sequence], tokens: torch.Tensor | None,
                   scheduler: Scheduler, kv: KVCacheManager) -> tuple[SchedulerOutput, FedTokens] | None:
    """The step after ``previous`` (launched, its progress counted by ``step_done``; ``sampled``: its sequences that
    sampled, in row order; ``tokens``: what they sampled, on the device), as the synchronous scheduler would take it
    once those tokens are appended: the running sequences in order while the token budget lasts (a decode of the
    token in flight, fed, or the rest of a prompt), then waiting ones; blocks allocated. None where that step would
    preempt, or where no token is in flight (the caller then completes ``previous`` first)."""
    if previous.preempted or not sampled:
        return None
    in_flight = {id(seq): row for row, seq in enumerate(sampled)}
    budget, items, index, need = scheduler.max_num_batched_tokens, [], [], 0
    # a sequence that stopped (or was aborted) after ``previous`` was launched has left the running list: its row in
    # ``previous`` is dropped when reported, and this step goes on without it
    for seq in scheduler.running:
        if budget <= 0:
            break                     # the rest keep their place, as the synchronous scheduler leaves them
        row = in_flight.get(id(seq))
        if row is not None and stops_on_length(seq):
            continue                  # ends once its token is appended: the synchronous scheduler never sees it
        num_new = 1 if row is not None else min(seq.num_tokens - seq.num_computed_tokens, budget)
        need += max(0, kv.blocks_needed(seq.num_computed_tokens + num_new) - len(seq.block_ids))
        items.append(ScheduledSequence(seq, num_new, fed=row is not None))
        index.append(row)
        budget -= num_new
    if not any(item.fed for item in items) or need > kv.num_free_blocks:
        return None                   # nothing to feed, or the synchronous scheduler would preempt
    for item in items:
        allocated = kv.allocate(item.seq, item.num_new_tokens)
        assert allocated, "the pool was counted to hold every row's new positions"
    out = SchedulerOutput(items)
    scheduler.admit_waiting(out, budget)      # behind the running ones, as the synchronous scheduler admits them
    fed, positions, sample_rows, flat, sampling = [], [], [], 0, 0
    for item, row in zip(items, index):
        if item.fed:
            fed.append(row)
            positions.append(flat)
            sample_rows.append(sampling)
        flat += item.num_new_tokens
        sampling += item.samples
    return out, FedTokens(tokens, fed, positions, sample_rows)
