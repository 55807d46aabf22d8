"""Persistent inputs of bucketed decode steps: every graph reads these addresses; each step refills them.

One int64 buffer holds token ids | positions | slots | sequence lengths (``max_batch`` each) and one
int32 buffer the block tables (``max_batch`` rows of ``max_blocks_per_seq``, the most blocks a sequence
can hold). ``fill(out, bucket)`` writes the step's B real rows and pads rows B..bucket-1 with a token
that writes no KV (slot -1), sits at position 0 and attends to one key (block 0, offset 0: a valid,
finite slot of the pool), so a padding row computes finite values of its own and, every op being
row-wise, leaves the real rows alone. On a GPU the host side is a pinned mirror copied in one
non-blocking copy per buffer; the mirror is refilled only once the previous copy has landed. A step launched
before the previous one's tokens reached the host (``fed``) takes its token ids from the device, copied over
the host's placeholders in stream order.
``meta(bucket)`` is the step's ``AttentionMetadata`` over these buffers, with host lists fixed per
bucket (one new token per row, the capacity as length) so nothing in the captured region depends on
Python data that changes between replays; the device tensors carry the real lengths.
"""
from __future__ import annotations

import torch

from gh200rt.kv.block_row import block_row
from gh200rt.models.base import AttentionMetadata
from gh200rt.scheduler.scheduler import SchedulerOutput

# token id, position, slot, sequence length of a padding row
PAD_ROW = (0, 0, -1, 1)


class DecodeBuffers:
    def __init__(self, max_batch: int, max_blocks_per_seq: int, block_size: int, device: torch.device | str):
        self.device = torch.device(device)
        self.max_batch, self.max_blocks, self.block_size = max_batch, max_blocks_per_seq, block_size
        n = max_batch
        self.int64 = torch.zeros(4, n, dtype=torch.int64, device=self.device)
        self.input_ids, self.positions, self.slot_mapping, self.seq_lens = self.int64.unbind(0)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int64, device=self.device)  # one token per row
        self.block_tables = torch.zeros(n, max_blocks_per_seq, dtype=torch.int32, device=self.device)
        on_gpu = self.device.type == "cuda"
        self._host64 = torch.zeros(4, n, dtype=torch.int64, pin_memory=True) if on_gpu else self.int64
        self._host_tables = torch.zeros(n, max_blocks_per_seq, dtype=torch.int32, pin_memory=True) \
            if on_gpu else self.block_tables
        self._host_tables_np = self._host_tables.numpy()     # the same memory: rows are copied in as numpy
        self._copied = torch.cuda.Event() if on_gpu else None
        self._pad = torch.tensor(PAD_ROW, dtype=torch.int64)[:, None]
        self._rows = 0     # table rows and columns that may hold non-zero ids from the last fill
        self._width = 0
        self.host_kv = None   # the host KV blocks tables may name (``ModelRunner.read_host_blocks``)

    def fill(self, out: SchedulerOutput, bucket: int, fed=None) -> None:
        """The step's rows: one per decoding sequence, and one per position of a sequence that verifies drafts
        (its last token, then each draft, each attending to the keys up to its position, as ``pack_step`` lays
        them out)."""
        batch = sum(item.num_new_tokens for item in out.scheduled)
        assert 0 < batch <= bucket <= self.max_batch, (batch, bucket, self.max_batch)
        ids, positions, slots, lens, tables = [], [], [], [], []
        bs = self.block_size
        for item in out.scheduled:
            seq = item.seq
            p = seq.num_computed_tokens
            assert item.num_new_tokens == 1 + len(item.draft_token_ids), "only decode steps run bucketed"
            row = block_row(seq)
            for j, token in enumerate(item.token_ids() if item.draft_token_ids else [None]):
                ids.append(token if token is not None else 0 if item.fed else seq.all_token_ids[p])
                positions.append(p + j)
                slots.append(seq.block_ids[(p + j) // bs] * bs + (p + j) % bs)
                lens.append(p + j + 1)
                tables.append(row)
        width = max(len(t) for t in tables)
        if width > self.max_blocks:
            raise ValueError(f"a sequence holds {width} KV blocks but the graph buffers were sized for "
                             f"{self.max_blocks} (max_model_len / block_size); this is a bug in sizing them")
        if self._copied is not None:
            self._copied.synchronize()   # the last step's copy out of the pinned mirror has landed
        host, host_tables = self._host64, self._host_tables
        host[:, :batch] = torch.tensor([ids, positions, slots, lens], dtype=torch.int64)
        host[:, batch:bucket] = self._pad
        rows = self._host_tables_np
        rows[:max(batch, self._rows), :max(width, self._width)] = 0
        for i, table in enumerate(tables):
            rows[i, :len(table)] = table
        self._rows, self._width = batch, width
        if self._copied is not None:
            self.int64.copy_(host, non_blocking=True)     # whole (contiguous) rows: one plain copy
            self.block_tables[:bucket].copy_(host_tables[:bucket], non_blocking=True)
            self._copied.record()
        if fed is not None:
            fed.write_into(self.input_ids)

    def meta(self, bucket: int) -> AttentionMetadata:
        capacity = self.max_blocks * self.block_size
        return AttentionMetadata(
            query_start_loc=self.query_start_loc[:bucket + 1], seq_lens=self.seq_lens[:bucket],
            block_tables=self.block_tables[:bucket], slot_mapping=self.slot_mapping[:bucket],
            query_lens_list=[1] * bucket, seq_lens_list=[capacity] * bucket, block_size=self.block_size,
            host_kv=self.host_kv)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every buffer a graph reads (for the address check)."""
        return {"inputs.int64": self.int64, "inputs.query_start_loc": self.query_start_loc,
                "inputs.block_tables": self.block_tables}
