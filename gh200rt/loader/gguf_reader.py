"""A minimal GGUF (v2/v3) reader: metadata as Python values, tensors as views into one read-only memory map.

Written for load speed: gguf.GGUFReader builds numpy views for every metadata item (seconds for a
50k-token vocabulary); this walks the header once with ``struct``. Any inconsistency (short
header, tensor data past the end of the file) raises ``ModelLoadError`` naming the file.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass

import numpy as np

from gh200rt.loader.dequant import BLOCK, TYPE_NAMES
from gh200rt.loader.errors import ModelLoadError

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_LENGTH = struct.Struct("<Q")


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]      # numpy order (rows first): GGUF stores dims fastest-first
    ggml_type: int
    data: np.ndarray            # uint8 view of the tensor's bytes


class _Cursor:
    def __init__(self, buffer):
        self.buffer = buffer
        self.pos = 0

    def scalar(self, fmt: str):
        value = struct.unpack_from(fmt, self.buffer, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.scalar("<Q")
        end = self.pos + length
        if end > len(self.buffer):
            raise struct.error("string runs past the end of the file")
        value = bytes(self.buffer[self.pos:end]).decode("utf-8", errors="replace")
        self.pos = end
        return value

    def strings(self, count: int) -> list[str]:
        """``count`` strings in a row (a vocabulary: tens of thousands, read in one tight loop)."""
        buffer, pos, end_of_file, unpack = self.buffer, self.pos, len(self.buffer), _LENGTH.unpack_from
        values = []
        for _ in range(count):
            start = pos + 8
            pos = start + unpack(buffer, pos)[0]
            if pos > end_of_file:
                raise struct.error("string runs past the end of the file")
            values.append(str(buffer[start:pos], "utf-8", "replace"))
        self.pos = pos
        return values

    def value(self, kind: int):
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item_kind, count = self.scalar("<I"), self.scalar("<Q")
            if item_kind == _STRING:
                return self.strings(count)
            fmt = _SCALARS[item_kind]
            size = struct.calcsize(fmt)
            items = np.frombuffer(self.buffer, dtype=np.dtype(fmt), count=count, offset=self.pos)
            self.pos += size * count
            return items.tolist()
        return self.scalar(_SCALARS[kind])


def read_gguf(path: str) -> tuple[dict, dict[str, GGUFTensorInfo]]:
    try:
        with open(path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path} cannot be read: {e}") from e
    try:
        return _parse(path, mapped)
    except (struct.error, KeyError, ValueError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{path} is truncated or corrupt and cannot be read as GGUF: {e}") from e


def _parse(path: str, mapped) -> tuple[dict, dict[str, GGUFTensorInfo]]:
    cur = _Cursor(mapped)
    if bytes(mapped[:4]) != b"GGUF":
        raise ValueError("missing GGUF magic")
    cur.pos = 4
    version = cur.scalar("<I")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} (gh200rt reads versions 2 and 3)")
    tensor_count, kv_count = cur.scalar("<Q"), cur.scalar("<Q")
    metadata = {}
    for _ in range(kv_count):
        key = cur.string()
        metadata[key] = cur.value(cur.scalar("<I"))
    infos = []
    for _ in range(tensor_count):
        name = cur.string()
        dims = [cur.scalar("<Q") for _ in range(cur.scalar("<I"))]
        infos.append((name, tuple(reversed(dims)), cur.scalar("<I"), cur.scalar("<Q")))
    alignment = int(metadata.get("general.alignment", 32))
    data_start = -(-cur.pos // alignment) * alignment
    whole = np.frombuffer(mapped, dtype=np.uint8)
    tensors = {}
    for name, shape, ggml_type, offset in infos:
        if ggml_type not in BLOCK:
            raise ValueError(f"tensor {name} has GGML type {ggml_type}; supported: {', '.join(TYPE_NAMES.values())}")
        per_block, block_bytes = BLOCK[ggml_type]
        count = int(np.prod(shape))
        if count % per_block:
            raise ValueError(f"tensor {name} has {count} values, not a multiple of the block size {per_block}")
        start = data_start + offset
        end = start + count // per_block * block_bytes
        if end > len(whole):
            raise ValueError(f"tensor {name} ends at byte {end} but the file has only {len(whole)} bytes")
        tensors[name] = GGUFTensorInfo(name, shape, ggml_type, whole[start:end])
    return metadata, tensors
