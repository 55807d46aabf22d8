"""One step's sampling parameters as tensors on the logits' device, built from host lists.

Every tensor goes host -> device in one non-blocking copy from page-locked memory when the device
is a GPU (``device_inputs.to_device``), so building them never stalls the host on the GPU. Token-id lists of
different lengths are padded with ``V`` (one past the vocabulary): scattered into a ``[R, V + 1]``
table, the padding lands in a column that is then dropped. Penalties are engine/penalties.py's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gh200rt.engine.device_inputs import to_device
from gh200rt.scheduler.request import Sequence


def padded_ids(rows: list[list[int]], pad: int, device: torch.device) -> torch.Tensor:
    """int64 ``[len(rows), longest]`` (at least one column), short rows padded with ``pad``."""
    width = max(1, max((len(r) for r in rows), default=0))
    return to_device([r + [pad] * (width - len(r)) for r in rows], torch.int64, device)


@dataclass
class SamplingTensors:
    """Per-row parameters of the rows that draw at random (``random_rows`` of the batch)."""
    random_rows: torch.Tensor          # int64 [R]
    temperature: torch.Tensor          # float32 [R, 1]
    top_k: torch.Tensor                # int64 [R]; 0 = off
    top_p: torch.Tensor                # float32 [R]; 1.0 = off
    min_p: torch.Tensor                # float32 [R]; 0.0 = off
    any_top_k: bool
    any_top_p: bool
    any_min_p: bool
    max_top_k: int

    def select(self, rows: torch.Tensor) -> "SamplingTensors":
        """The same parameters for a subset of these rows (``rows`` index this batch's rows)."""
        return SamplingTensors(self.random_rows.index_select(0, rows), self.temperature.index_select(0, rows),
                               self.top_k.index_select(0, rows), self.top_p.index_select(0, rows),
                               self.min_p.index_select(0, rows), self.any_top_k, self.any_top_p, self.any_min_p,
                               self.max_top_k)

    @classmethod
    def build(cls, seqs: list[Sequence], rows: list[int], device: torch.device) -> "SamplingTensors":
        params = [seqs[i].params for i in rows]
        floats = to_device([[p.temperature, p.top_p, p.min_p] for p in params], torch.float32, device)
        return cls(random_rows=to_device(rows, torch.int64, device), temperature=floats[:, 0:1],
                   top_k=to_device([p.top_k or 0 for p in params], torch.int64, device),
                   top_p=floats[:, 1], min_p=floats[:, 2],
                   any_top_k=any(p.top_k for p in params), any_top_p=any(p.top_p < 1.0 for p in params),
                   any_min_p=any(p.min_p > 0.0 for p in params), max_top_k=max(p.top_k or 0 for p in params))


def banned_until_min_tokens(seq: Sequence, in_flight: bool = False) -> list[int]:
    """Ids a sequence may not produce yet: its stop ids and EOS while it has fewer than min_tokens (``in_flight``:
    one more output token is on the device)."""
    p = seq.params
    if len(seq.output_token_ids) + in_flight >= p.min_tokens:
        return []
    return sorted(set(p.stop_token_ids) | (set() if p.ignore_eos else set(seq.eos_token_ids)))


def mask_ids(logits: torch.Tensor, rows: list[int], ids: list[list[int]]) -> None:
    """Set ``logits[rows[j], ids[j]]`` to -inf, in place."""
    vocab = logits.shape[1]
    index = to_device(rows, torch.int64, logits.device)
    mask = torch.zeros(len(rows), vocab + 1, dtype=torch.bool, device=logits.device)
    mask.scatter_(1, padded_ids(ids, vocab, logits.device), True)
    logits.index_copy_(0, index, logits.index_select(0, index).masked_fill(mask[:, :vocab], float("-inf")))
