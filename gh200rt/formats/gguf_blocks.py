"""Lossless import of GGUF Q8_0 / Q4_0 / Q4_1 blocks into ``PackedWeight``.

A GGUF block covers 32 consecutive columns of one row. Q8_0: fp16 ``d`` + 32 int8 (``w = d q``).
Q4_0: fp16 ``d`` + 16 bytes (``w = d (q - 8)``). Q4_1: fp16 ``d``, fp16 ``m`` + 16 bytes
(``w = d q + m``). In the 4-bit blocks byte ``j`` holds column ``j`` in its low nibble and column
``j + 16`` in its high nibble; we repack to adjacent-column nibbles. fp16 ``d`` and ``m`` are exact
in float32 and ``-8 d`` is exact too, so every format maps without loss.
"""
from __future__ import annotations

import numpy as np
import torch

from gh200rt.formats.packed_layout import pack_int4
from gh200rt.formats.packed_weight import PackedWeight

GGML_Q4_0, GGML_Q4_1, GGML_Q8_0 = 2, 3, 8
_BLOCK = 32
_BLOCK_BYTES = {GGML_Q4_0: 18, GGML_Q4_1: 20, GGML_Q8_0: 34}


def _field(obj, *names):
    for name in names:
        if hasattr(obj, name):
            return getattr(obj, name)
    return None


def is_gguf_tensor(obj) -> bool:
    return not isinstance(obj, torch.Tensor) and _field(obj, "ggml_type", "tensor_type") is not None


def from_gguf(tensor) -> PackedWeight:
    """From an object with ``ggml_type`` (or ``tensor_type``), raw bytes (``raw`` or ``data``) and the
    logical ``shape`` ``(N, K)`` in torch order (GGUF lists dimensions the other way round)."""
    ggml_type = int(_field(tensor, "ggml_type", "tensor_type"))
    raw = np.asarray(_field(tensor, "raw", "data"))
    n, k = (int(d) for d in _field(tensor, "shape"))
    return from_gguf_blocks(ggml_type, raw, (n, k))


def packed_nbytes(tensor) -> int | None:
    """Bytes of the ``PackedWeight`` that ``from_gguf`` makes of ``tensor`` (None: a type or shape it does not
    import), without reading the blocks: codes (a byte, or half a byte, a weight) and a float32 scale, plus a
    float32 minimum for the 4-bit types, per block of 32 columns."""
    ggml_type = int(_field(tensor, "ggml_type", "tensor_type"))
    n, k = (int(d) for d in _field(tensor, "shape"))
    if ggml_type not in _BLOCK_BYTES or k % _BLOCK:
        return None
    groups = n * (k // _BLOCK)
    return n * k + 4 * groups if ggml_type == GGML_Q8_0 else n * (k // 2) + 8 * groups


def from_gguf_blocks(ggml_type: int, raw: np.ndarray, shape: tuple[int, int]) -> PackedWeight:
    n, k = shape
    if ggml_type not in _BLOCK_BYTES:
        raise ValueError(f"GGUF tensor type {ggml_type} cannot be imported as a packed weight: only "
                         f"Q4_0 ({GGML_Q4_0}), Q4_1 ({GGML_Q4_1}) and Q8_0 ({GGML_Q8_0}) are supported; "
                         "use --host-weight-dtype bf16 to dequantize it instead")
    if k % _BLOCK:
        raise ValueError(f"GGUF quantized tensor of shape {shape}: K={k} is not a multiple of {_BLOCK}")
    blocks_per_row = k // _BLOCK
    expected = n * blocks_per_row * _BLOCK_BYTES[ggml_type]
    flat = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    if flat.size != expected:
        raise ValueError(f"GGUF tensor of shape {shape} type {ggml_type}: {flat.size} bytes, expected {expected}")
    blocks = flat.reshape(n, blocks_per_row, _BLOCK_BYTES[ggml_type])
    d = torch.from_numpy(blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32))
    if ggml_type == GGML_Q8_0:
        q = torch.from_numpy(blocks[..., 2:].copy().view(np.int8)).reshape(n, k)
        return PackedWeight("int8", q.contiguous(), d.contiguous(), None, _BLOCK, (n, k))
    if ggml_type == GGML_Q4_1:
        minimum = torch.from_numpy(blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32))
        nibbles = blocks[..., 4:]
    else:
        minimum = -8.0 * d
        nibbles = blocks[..., 2:]
    nib = torch.from_numpy(nibbles.copy())
    codes = torch.cat([nib & 0xF, nib >> 4], dim=-1).reshape(n, k)
    return PackedWeight("int4", pack_int4(codes), d.contiguous(), minimum.contiguous(), _BLOCK, (n, k))
