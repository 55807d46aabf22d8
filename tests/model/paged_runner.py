"""Drive a gh200rt model through the paged path: contiguous blocks per sequence, prefill (optionally in
chunks), then one-token decode steps that read the paged cache."""
from __future__ import annotations

import torch

from gh200rt.engine.model_runner import forward
from gh200rt.kv.pool import allocate_arch_kv_caches
from gh200rt.models.base import AttentionMetadata
from gh200rt.weights.schedule import NULL_HOOKS


class PagedRunner:
    def __init__(self, model, block_size: int = 4, num_blocks: int = 64, dtype: torch.dtype | None = None,
                 hooks=NULL_HOOKS):
        arch = model.arch
        self.hooks = hooks
        dtype = dtype or model.dtype
        self.model = model
        self.block_size = block_size
        self.caches = allocate_arch_kv_caches(arch, num_blocks, block_size, dtype)
        # deliberately not starting at block 0 and not in order, so block tables matter
        self.table = list(range(num_blocks - 1, 0, -1))

    @torch.inference_mode()
    def step(self, new_ids: list[int], seq_len: int) -> torch.Tensor:
        """Feed the last ``len(new_ids)`` tokens of a ``seq_len``-token sequence; logits of every new token."""
        blocks = -(-seq_len // self.block_size)
        meta = AttentionMetadata.build([len(new_ids)], [seq_len], [self.table[:blocks]], self.block_size)
        hidden = forward(self.model, torch.tensor(new_ids), meta.positions(), meta, self.caches, self.hooks)
        return self.model.compute_logits(hidden)

    def prefill(self, ids: list[int], chunks: list[int] | None = None) -> torch.Tensor:
        chunks = chunks or [len(ids)]
        done, outs = 0, []
        for size in chunks:
            outs.append(self.step(ids[done:done + size], done + size))
            done += size
        assert done == len(ids)
        return torch.cat(outs)

    def greedy(self, ids: list[int], steps: int) -> tuple[list[int], torch.Tensor]:
        """Greedy continuation and the logits that chose each token ([steps, V])."""
        logits = self.prefill(ids)[-1:]
        out, seen = [], [logits[0]]
        seq = list(ids)
        for _ in range(steps):
            token = int(seen[-1].argmax())
            out.append(token)
            seq.append(token)
            if len(out) == steps:
                break
            seen.append(self.step([token], len(seq))[0])
        return out, torch.stack(seen)
