"""Continuous batching: which sequences compute how many tokens this step.

Each step spends at most ``max_num_batched_tokens`` tokens over at most ``max_num_seqs`` running
sequences. Running sequences go first (decodes and unfinished prefill chunks, oldest first),
then waiting ones in arrival order; a prompt longer than the remaining budget is prefilled in
chunks over several steps. A decoding sequence that drafted tokens (speculative decoding: ``seq.spec_drafts``)
computes them after its last token in the same step, as many as the budget and the pool allow (drafts go before
preemption). When the pool has no block for a running sequence, the newest
running sequence is preempted by recompute: its blocks are freed and it waits at the head of
the queue to recompute prompt + generated tokens later (what of them the prefix cache or its host tier still holds is
reused, not recomputed). No preemption happens in a step that
admits new sequences. Running sequences use at most ``max_loras`` distinct LoRA adapters (``seq.lora_id``,
0 = none): a waiting sequence of another adapter is passed over, keeping its place, until one frees up; so is one
whose cached prefix the host KV tier is reading from disk, until its blocks are in host memory.
Hardware-agnostic: only token counts and block ids.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from gh200rt.kv.kv_manager import KVCacheManager
from gh200rt.scheduler.request import Sequence, Status


@dataclass
class ScheduledSequence:
    seq: Sequence
    num_new_tokens: int
    # a decode of the token the previous step sampled, launched before that token reached the host: its input id is
    # read on the device (engine/run_ahead.py), so ``seq`` does not hold it yet
    fed: bool = False
    # drafted tokens computed after the sequence's last one (counted in ``num_new_tokens``), verified by the sampler
    draft_token_ids: list[int] = field(default_factory=list)

    @property
    def computes_prompt(self) -> bool:
        """True unless this step decodes one token after the prompt, drafts after it or not (a recompute of
        generated tokens counts as prompt: it is prefilled)."""
        return not self.fed and (self.num_new_tokens - len(self.draft_token_ids) > 1
                                 or self.seq.num_computed_tokens < len(self.seq.prompt_token_ids))

    @property
    def samples(self) -> bool:
        """True when this step computes the sequence's last uncomputed token (its logits sample, and each drafted
        token's after it); never for an embedding sequence (it pools instead)."""
        return self.fed or (self.seq.pooling is None and self.seq.num_computed_tokens + self.num_new_tokens
                            - len(self.draft_token_ids) == self.seq.num_tokens)

    def token_ids(self) -> list[int]:
        """The input ids this step computes for the sequence (not for a fed one)."""
        start = self.seq.num_computed_tokens
        if not self.draft_token_ids:
            return self.seq.all_token_ids[start:start + self.num_new_tokens]
        return self.seq.all_token_ids[start:] + self.draft_token_ids


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_loras: int | None = None):
        """``max_loras``: distinct adapters among running sequences (None: no LoRA, no bound)."""
        self.kv = kv
        self.max_loras = max_loras
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        # computed tokens preemptions let go of, and of those the ones the host KV tier keeps (a load brings them
        # back; the rest are recomputed): what the tier controller weighs a demotion against
        self.preempted_tokens = 0
        self.preempted_kept_tokens = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        running = list(self.running)
        kept: list[Sequence] = []
        while running and budget > 0:
            seq = running.pop(0)
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            drafts = seq.spec_drafts[:budget - 1] if num_new == 1 else []
            while not self.kv.allocate(seq, num_new + len(drafts)):
                if drafts:
                    drafts = []              # the pool is short: verify nothing rather than preempt
                    continue
                victim = running.pop() if running else seq
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is Status.RUNNING:
                kept.append(seq)
                out.scheduled.append(ScheduledSequence(seq, num_new + len(drafts), draft_token_ids=drafts))
                budget -= num_new + len(drafts)
        self.running = kept + running            # sequences left over (no budget) keep their place
        if not out.preempted:
            budget = self.admit_waiting(out, budget)
        return out

    def admit_waiting(self, out: SchedulerOutput, budget: int) -> int:
        """Admit waiting sequences in arrival order into ``out`` while ``budget`` tokens, a batch slot and KV blocks
        last (never by preempting); returns the budget left."""
        passed: list[Sequence] = []               # other adapters' sequences, back at the head afterwards
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not self._adapter_fits(seq):
                passed.append(self.waiting.popleft())
                continue
            if self._must_wait_for_prompt_owner(seq):
                break
            if not seq.block_ids and not self._reuse_computed_prefix(seq):
                passed.append(self.waiting.popleft())    # its prefix is on its way from disk: the others go first
                continue
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if not self.kv.allocate(seq, num_new):
                self.kv.free(seq)
                seq.num_computed_tokens = 0
                break
            self.kv.start_host_loads(seq)
            self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSequence(seq, num_new))
            budget -= num_new
        self.waiting.extendleft(reversed(passed))
        return budget

    def _adapter_fits(self, seq: Sequence) -> bool:
        if self.max_loras is None or not seq.lora_id:
            return True
        adapters = {s.lora_id for s in self.running if s.lora_id}
        return seq.lora_id in adapters or len(adapters) < self.max_loras

    def _shareable_prompt_blocks(self, seq: Sequence) -> int:
        return (len(seq.prompt_token_ids) - 1) // self.kv.block_size

    def _must_wait_for_prompt_owner(self, seq: Sequence) -> bool:
        owner = seq.share_prompt_from
        if owner is None or owner.is_finished or seq.output_token_ids:
            return False
        return owner.num_computed_tokens < self._shareable_prompt_blocks(seq) * self.kv.block_size

    def _reuse_computed_prefix(self, seq: Sequence) -> bool:
        """Adopt what is cached of ``seq``'s tokens (device pool, then host tier); False while the host tier reads
        more of it from disk: ``seq`` then holds nothing and waits."""
        owner = seq.share_prompt_from
        k = self._shareable_prompt_blocks(seq)
        if (owner is not None and not owner.is_finished and not seq.output_token_ids and k > 0
                and owner.num_computed_tokens >= k * self.kv.block_size
                and self.kv.is_device_prefix(owner.block_ids[:k])):   # host blocks read in place: looked up below
            self.kv.adopt_prefix(seq, owner.block_ids[:k], owner.block_hashes[:k])
            return True
        if seq.computes_whole_prompt:
            return True                  # every prompt position must be computed (to score it, or to pool it)
        block_ids, hashes = self.kv.find_cached_prefix(seq.all_token_ids, seq.cache_salt)
        if block_ids:
            self.kv.adopt_prefix(seq, block_ids, hashes)
        found = self.kv.find_host_prefix(seq, hashes)     # the host KV tier, where the device pool's hit ends
        if found is None:
            self.kv.free(seq)
            seq.num_computed_tokens = 0
            return False
        if found:
            self.kv.adopt_host_prefix(seq, found, prompt_only=seq.prompt_only)
        if seq.num_computed_tokens and not seq.output_token_ids and seq.num_preemptions == 0:
            seq.num_cached_tokens = seq.num_computed_tokens
        return True

    def _preempt(self, seq: Sequence) -> None:
        # what the preemption lets go of: not the prefix other requests hold (it stays in the device pool), and of
        # the rest what the host KV tier keeps comes back as loads (the tier keeps leading blocks, the shared ones too)
        shared = self.kv.tokens_shared_on_device(seq)
        self.preempted_tokens += seq.num_computed_tokens - shared
        self.preempted_kept_tokens += max(0, self.kv.tokens_kept_after_free(seq) - shared)
        self.kv.free(seq)
        seq.num_computed_tokens = 0
        seq.draft_computed = 0          # a draft model's KV lived in the blocks just freed
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def step_done(self, out: SchedulerOutput) -> None:
        """Advance KV progress of everything computed this step and publish its full blocks (drafted positions
        count once verification keeps them: ``engine/stepping.py``)."""
        for item in out.scheduled:
            seq = item.seq
            seq.num_computed_tokens += item.num_new_tokens - len(item.draft_token_ids)
            self.kv.publish_full_blocks(seq)

    def finish(self, seq: Sequence) -> None:
        """Free a finished or aborted sequence's blocks at once."""
        if seq.status is not Status.FINISHED:
            seq.status = Status.FINISHED
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.running:
            self.running.remove(seq)
        self.kv.free(seq)
