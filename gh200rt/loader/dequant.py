"""Vectorised numpy dequantizers for the GGML block formats gh200rt reads, and the quantized form kept for kernels.

Block layouts (32 values per block): Q8_0 = f16 scale + 32 int8; Q4_0 = f16 scale + 16 bytes of
nibbles (low nibbles are values 0-15, high nibbles 16-31), value = d * (q - 8); Q4_1 = f16 scale,
f16 min + 16 bytes of nibbles, value = d * q + m.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

F32, F16, Q4_0, Q4_1, Q8_0, BF16 = 0, 1, 2, 3, 8, 30
TYPE_NAMES = {F32: "F32", F16: "F16", Q4_0: "Q4_0", Q4_1: "Q4_1", Q8_0: "Q8_0", BF16: "BF16"}
# ggml type -> (values per block, bytes per block)
BLOCK = {F32: (1, 4), F16: (1, 2), BF16: (1, 2), Q4_0: (32, 18), Q4_1: (32, 20), Q8_0: (32, 34)}


@dataclass(frozen=True)
class QuantizedTensor:
    """A GGUF tensor as stored: ``ggml_type`` (e.g. 3 = Q4_1), raw block bytes, logical ``[rows, cols]`` shape."""
    ggml_type: int
    data: np.ndarray            # uint8 [rows, bytes_per_row], rows in transformers' order (llama q/k un-permuted)
    shape: tuple[int, ...]

    @property
    def type_name(self) -> str:
        return TYPE_NAMES[self.ggml_type]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def dequantize(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> np.ndarray:
    """float32 array of ``shape`` from the raw bytes of one tensor."""
    raw = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if ggml_type == F32:
        out = raw.view(np.float32)
    elif ggml_type == F16:
        out = raw.view(np.float16).astype(np.float32)
    elif ggml_type == BF16:
        out = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    elif ggml_type in (Q4_0, Q4_1, Q8_0):
        blocks = raw.reshape(-1, BLOCK[ggml_type][1])
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
        if ggml_type == Q8_0:
            out = d * blocks[:, 2:].view(np.int8).astype(np.float32)
        elif ggml_type == Q4_0:
            out = d * (_nibbles(blocks[:, 2:]).astype(np.int8) - 8).astype(np.float32)
        else:
            m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
            out = d * _nibbles(blocks[:, 4:]).astype(np.float32) + m
    else:
        raise ValueError(f"GGML tensor type {ggml_type} is not supported; supported: "
                         f"{', '.join(TYPE_NAMES.values())}")
    return out.reshape(shape)
