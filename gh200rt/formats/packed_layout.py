"""The layouts of the three quantized host formats, and the nibble packing of int4.

All three are over a logical dense weight ``W[N, K]`` (out, in) split along K into groups of ``group_size``
columns (``group_size == K`` means one group per output channel):

* ``int8``: ``qweight`` int8 ``[N, K]``; ``W = q * scale``.
* ``fp8``: ``qweight`` float8_e4m3fn ``[N, K]``; ``W = q * scale``: one group per output channel (the layout of
  Hugging Face FP8 checkpoints, whose per-tensor or per-channel ``weight_scale`` becomes a per-row scale without
  loss), or groups of a block's columns (a block-FP8 checkpoint's ``weight_scale_inv``, each row carrying its
  block row's scales: DeepSeek-V3's 128x128 blocks).
* ``int4``: ``qweight`` uint8 ``[N, ceil(K/2)]``, column ``k`` in byte ``k // 2`` (low nibble for
  even k); ``W = q * scale + minimum`` with ``q`` in 0..15.

``scale`` / ``minimum`` are float32 ``[N, ceil(K/group_size)]``. GGUF Q8_0 maps onto int8 with
group 32, Q4_1 onto int4 (scale d, minimum m) and Q4_0 onto int4 (scale d, minimum -8d) without
loss (``gguf_blocks.py``). ``PackedWeight`` (``packed_weight.py``) holds a weight in one of them.
"""
from __future__ import annotations

import torch

FP8_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448
INT4_DEFAULT_GROUP = 32


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """uint8 ``[N, ceil(K/2)]`` from 4-bit codes ``[N, K]`` (even column in the low nibble)."""
    n, k = q.shape
    q = q.to(torch.uint8)
    if k % 2:
        q = torch.cat([q, q.new_zeros(n, 1)], dim=1)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()


def unpack_int4(packed: torch.Tensor, k: int) -> torch.Tensor:
    """uint8 codes ``[N, K]`` from the packed nibbles."""
    low, high = packed & 0xF, packed >> 4
    return torch.stack([low, high], dim=-1).reshape(packed.shape[0], -1)[:, :k]

