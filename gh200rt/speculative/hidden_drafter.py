"""Drafting from the target's hidden states (``eagle3``): a head of one decoder layer that reads, at each
position, what the target computed there and the token that followed.

The runner returns every step's hidden states at the head's ``capture_layers`` (``model_runner.forward_capturing``);
after the step the engine hands each sequence's rows of positions it kept (``take_hidden``: a prompt chunk's every
position, a verification's last token and accepted drafts) to this proposer, which folds them (``head.combine``) and
keeps them as the sequence's pending rows. Drafting first catches the head up on the pending rows, each position p
with the token at p + 1 (the target's own choice is known for every kept position), then goes on alone: the last row
drafts the token after the sequence's last, and each further step feeds the head's own output hidden state and
draft back in at the next position. Positions the head computed from its own hidden states are computed again from
the target's once verification keeps them.

The head's KV cache has the target pool's blocks (same ids, as the ``draft_model`` method's): a sequence's block table
serves both, and the drafted positions' blocks are those its verification writes. Where the head never saw a
position (a prefix-cache hit, a sequence that was not drafting) its KV there is whatever the block last held: that
costs acceptance, never correctness, since verification decides every token. So do host KV blocks the target reads
in place (``--kv-offloading-reads``): the target computed no hidden state there, and the head's table names block 0
for them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gh200rt.engine.model_runner import step_inputs
from gh200rt.engine.sampler import Sampler
from gh200rt.kv.pool import allocate_arch_kv_caches
from gh200rt.scheduler.request import Sequence
from gh200rt.speculative.draft_model import choose_drafts, pack_draft_step


@dataclass
class PendingRows:
    """A sequence's folded hidden states of positions [start, end) that the head has not read yet."""
    start: int
    rows: list[torch.Tensor] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.start + sum(r.shape[0] for r in self.rows)

    def cut(self, end: int) -> None:
        """Keep positions before ``end`` only (``start <= end``)."""
        kept, at = [], self.start
        for r in self.rows:
            if at >= end:
                break
            kept.append(r[:end - at])
            at += r.shape[0]
        self.rows = kept


class HiddenStateProposer:
    """Drafts with a head (``eagle3.Eagle3Head``) over a one-layer KV cache of the target pool's blocks."""

    def __init__(self, head, num_blocks: int, block_size: int, kv_dtype: torch.dtype, device: str,
                 sampler: Sampler, first_host_id: int | None = None):
        """``num_blocks``: the pool's KV blocks (the head's cache has as many); ``first_host_id``: the first table
        entry that names a host KV block (the pool's block count: ids between the two are resident weights' runs,
        kv/arena.py, whose sequences do not draft)."""
        self.head = head
        self.first_host_id = first_host_id if first_host_id is not None else num_blocks
        self.block_size = block_size
        self.device = device
        self.sampler = sampler
        self.num_blocks = num_blocks
        self.kv_caches = allocate_arch_kv_caches(head.arch, num_blocks, block_size, kv_dtype, device)
        self.pending: dict[str, PendingRows] = {}

    @property
    def capture_layers(self) -> tuple[int, ...]:
        return self.head.capture_layers

    @property
    def kv_bytes(self) -> int:
        return sum(c.numel() * c.element_size() for c in self.kv_caches)

    @torch.inference_mode()
    def take_hidden(self, kept: list[tuple[Sequence, int, torch.Tensor]]) -> None:
        """After a step: each (sequence, first position, its captured rows of the positions it kept)."""
        if not kept:
            return
        # cat copies: a decode graph's output buffer, which the rows may view, is rewritten by its next replay
        folded = self.head.combine(torch.cat([rows for _, _, rows in kept]))
        at = 0
        for seq, start, rows in kept:
            n = rows.shape[0]
            mine, at = folded[at:at + n], at + n
            pending = self.pending.get(seq.seq_id)
            if pending is not None and pending.start <= start <= pending.end:
                pending.cut(start)           # positions computed again (after a preemption) replace the old rows
                pending.rows.append(mine)
            else:
                self.pending[seq.seq_id] = PendingRows(start, [mine])

    def retain(self, running: list[Sequence]) -> None:
        """Forget the rows of sequences that are not running (finished, or preempted: they compute again)."""
        ids = {seq.seq_id for seq in running}
        for seq_id in [s for s in self.pending if s not in ids]:
            del self.pending[seq_id]

    @torch.inference_mode()
    def propose(self, wanted: list[tuple[Sequence, int]]) -> None:
        """Set ``spec_drafts`` (and ``spec_draft_probs`` for sampling sequences) of each (sequence, how many tokens
        it may draft); the target's block table already covers the positions drafted."""
        wanted = [(seq, room) for seq, room in wanted if self._has_head_kv(seq) and self._caught_up_to_last(seq)]
        if not wanted:
            return
        rows, hidden = [], []
        for seq, _ in wanted:
            pending = self.pending.pop(seq.seq_id)
            tokens = seq.all_token_ids[pending.start + 1:pending.end + 1]
            rows.append((seq, pending.start, tokens))
            hidden.append(torch.cat(pending.rows) if len(pending.rows) > 1 else pending.rows[0])
            seq.spec_drafts, seq.spec_draft_probs = [], []
        hidden = torch.cat(hidden)
        active = list(wanted)
        for step in range(max(room for _, room in wanted)):
            step_rows = pack_draft_step(rows, self.block_size, self.first_host_id)
            inputs = step_inputs(step_rows, self.block_size, self.device)
            normed, carried = self.head(inputs.input_ids, inputs.positions, hidden, inputs.meta, self.kv_caches[0])
            logits = self.head.compute_logits(normed.index_select(0, inputs.sample_index))
            tokens, probs = choose_drafts(logits, [seq for seq, _ in active], self.sampler)
            last = carried.index_select(0, inputs.sample_index)
            for (seq, _), token, row in zip(active, tokens, probs):
                seq.spec_drafts.append(token)
                if row is not None:
                    seq.spec_draft_probs.append(row)
            kept = [i for i, (_, room) in enumerate(active) if room > step + 1]
            active = [active[i] for i in kept]
            if not active:
                break
            hidden = last[kept] if len(kept) < last.shape[0] else last
            rows = [(seq, seq.num_tokens - 1 + step, [seq.spec_drafts[-1]]) for seq, _ in active]
        for seq, _ in wanted:
            seq.spec_draft_probs = torch.stack(seq.spec_draft_probs) if seq.spec_draft_probs else None

    def _has_head_kv(self, seq: Sequence) -> bool:
        """Whether every block of ``seq`` has the head's KV, or is a host block read in place (no weights' run)."""
        if max(seq.block_ids) < self.num_blocks:
            return True
        return not any(self.num_blocks <= block < self.first_host_id for block in seq.block_ids)

    def _caught_up_to_last(self, seq: Sequence) -> bool:
        """Whether ``seq``'s pending rows reach its last computed position (they hold at least that row): the head
        then drafts the token after the sequence's last."""
        pending = self.pending.get(seq.seq_id)
        return pending is not None and pending.end == seq.num_computed_tokens and pending.end > pending.start
