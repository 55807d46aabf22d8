"""Async scheduling: launch step N+1 before step N's sampled tokens reach the host.

Step N+1 decodes, for each sequence that sampled in step N, the token N sampled. Only the device holds that token
yet, so the step's input ids are read from N's token tensor on the device (``FedTokens``), and the host detokenizes,
checks stop conditions and reports step N while N+1 runs: on a GPU the device no longer idles through the host's
per-step work. What the host learns late costs at most one discarded row: a sequence that stops on EOS, a stop
token or a stop string in step N is computed once more in N+1 and that row is dropped (its KV slot lies past its
last token, in a block that is never published: ``publish_full_blocks`` hashes known tokens only). A length stop
is known ahead: the sequence is left out of N+1.

``plan_run_ahead`` launches N+1 only where it is the step the synchronous scheduler would take next, so tokens do
not depend on the mode: every sequence of N sampled, is still running and is all that runs; each next position
fits the KV pool without preempting. Sampling reads the output so far: penalties and min_tokens count the token in
flight on the device (``Sampler.launch``'s ``fed``); where a grammar's mask or bad words read it on the host, the
step's model runs ahead and its sampling is launched once the previous step is taken in. Waiting
requests are admitted into N+1 behind the fed decodes, as the synchronous scheduler admits them behind its
running sequences (their prompts are on the host); a prompt chunk that does not end its prompt makes the step
after it synchronous. A seeded or greedy sequence gets the same tokens as without async scheduling;
an unseeded random one draws from the engine's generator, whose stream a discarded row shifts.
"""
from __future__ import annotations

import torch

from gh200rt.engine.device_inputs import to_device
from gh200rt.kv.kv_manager import KVCacheManager
from gh200rt.scheduler.request import Sequence
from gh200rt.scheduler.scheduler import ScheduledSequence, Scheduler, SchedulerOutput


class FedTokens:
    """A step's first ``len(index)`` input ids, read on the device: row i takes ``source[index[i]]`` (the previous
    step's tokens); the rows after them (admitted prompts) come from the host."""

    def __init__(self, source: torch.Tensor, index: list[int]):
        self.source, self.index = source, index
        self._ids: torch.Tensor | None = None

    def ids(self) -> torch.Tensor:
        """int64 [len(index)] on the device (gathered once: the inputs and the sampler's penalties read them)."""
        if self._ids is None:
            same = self.index == list(range(self.source.shape[0]))
            self._ids = self.source if same else \
                self.source.index_select(0, to_device(self.index, torch.int64, self.source.device))
        return self._ids


def reads_its_output_on_the_host(seq: Sequence) -> bool:
    """Whether ``seq``'s sampling reads its output so far on the host (a structured-output grammar's mask, bad
    words): a step launched ahead samples such a row only once the token in flight is appended."""
    return seq.grammar is not None or bool(seq.params.bad_words_token_ids)


def stops_on_length(seq: Sequence) -> bool:
    """Whether the token in flight, once appended, ends ``seq`` by max_tokens or the context limit."""
    p = seq.params
    return ((p.max_tokens is not None and len(seq.output_token_ids) + 1 >= p.max_tokens)
            or seq.num_tokens + 1 >= seq.max_model_len)


def plan_run_ahead(previous: SchedulerOutput, sampled: list[Sequence], scheduler: Scheduler,
                   kv: KVCacheManager) -> tuple[SchedulerOutput, list[int]] | None:
    """The step that follows ``previous`` (launched, its progress counted by ``step_done``; ``sampled``: its sequences
    that sampled, in row order): fed decodes first, then admitted prompts, blocks allocated; and for each fed row
    the row of ``sampled`` whose token it reads. None where the synchronous scheduler would take another step (the
    caller then completes ``previous`` first)."""
    seqs = [item.seq for item in previous.scheduled]
    if previous.preempted or not seqs or sampled != seqs:
        return None
    # a sequence that stopped (or was aborted) after ``previous`` was launched has left the running list: its row
    # in ``previous`` is dropped when reported, and the next step goes on without it
    if scheduler.running != [seq for seq in seqs if not seq.is_finished]:
        return None
    rows = [i for i, seq in enumerate(seqs) if not seq.is_finished and not stops_on_length(seq)]
    if not rows or len(rows) > scheduler.max_num_batched_tokens:
        return None
    need = sum(max(0, kv.blocks_needed(seqs[i].num_computed_tokens + 1) - len(seqs[i].block_ids)) for i in rows)
    if need > kv.num_free_blocks:
        return None                   # the synchronous scheduler would preempt
    for i in rows:
        allocated = kv.allocate(seqs[i], 1)
        assert allocated, "the pool was counted to hold every row's next position"
    out = SchedulerOutput([ScheduledSequence(seqs[i], 1, fed=True) for i in rows])
    # as the synchronous scheduler does after its running sequences: waiting ones, with the budget left (their
    # prompts are on the host; the fed rows stay first, so FedTokens covers the step's first input ids)
    scheduler.admit_waiting(out, scheduler.max_num_batched_tokens - len(rows))
    return out, rows
