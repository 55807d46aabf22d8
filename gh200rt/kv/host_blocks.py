"""Host KV blocks that attention reads in place: the KV analogue of the ``direct`` weight tier.

A block table entry names a device pool block (``0 .. num_device_blocks - 1``) or, from ``first_id`` on, block
``entry - first_id`` of the host KV tier (kv/host_tier.py), which the attention kernel reads where it lies: over
NVLink-C2C on GH200, over PCIe from pinned memory on an x86 host, from RAM on the CPU platform. A layer's
``HostBlocksView`` is its share of the tier, laid out as its device pool is (``[2, blocks, block_size, kv_heads,
head_dim]`` with the device pool's slot and head strides; the plane and block strides may differ).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class HostBlocksView:
    pool: torch.Tensor     # [2, host blocks, block_size, kv_heads, head_dim]: a view into the tier's memory
    first_id: int          # the table entry that names host block 0: the device pool's block count

    def __post_init__(self):
        assert self.pool.dim() == 5 and self.pool.shape[0] == 2, self.pool.shape
        assert self.first_id > 0, self.first_id
