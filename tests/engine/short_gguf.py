"""A GGUF file cut to its first decoder blocks: the shipped SmolLM2's shapes, weights, quantization types and
vocabulary, with fewer layers. The CPU route tests check kernels whose paths depend on a linear's shape, not on
the model's depth; four of SmolLM2's thirty blocks build and step several times faster.

The file is spliced, not rewritten: the header and metadata are copied byte for byte (only the tensor count and
the ``<arch>.block_count`` value change), the kept tensors' infos get new offsets, and their data is copied."""
from __future__ import annotations

import re
import struct

_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_BLOCK = re.compile(rb"blk\.(\d+)\.")


def _string_end(data: bytes, pos: int) -> int:
    return pos + 8 + struct.unpack_from("<Q", data, pos)[0]


def _value_end(data: bytes, pos: int, kind: int) -> int:
    if kind == _STRING:
        return _string_end(data, pos)
    if kind == _ARRAY:
        item_kind, count = struct.unpack_from("<IQ", data, pos)
        pos += 12
        if item_kind != _STRING:
            return pos + _SCALAR_SIZES[item_kind] * count
        for _ in range(count):
            pos = _string_end(data, pos)
        return pos
    return pos + _SCALAR_SIZES[kind]


def write_first_blocks(source: str, target: str, blocks: int) -> str:
    """``source`` with only blocks ``0 .. blocks - 1`` (and every tensor outside the blocks) at ``target``."""
    with open(source, "rb") as f:
        data = f.read()
    assert data[:4] == b"GGUF" and struct.unpack_from("<I", data, 4)[0] in (2, 3), f"{source} is not GGUF v2/v3"
    tensor_count, kv_count = struct.unpack_from("<QQ", data, 8)
    header = bytearray(data[:24])
    pos, alignment, block_count_at = 24, 32, None
    for _ in range(kv_count):
        key_end = _string_end(data, pos)
        key = data[pos + 8:key_end].decode()
        kind = struct.unpack_from("<I", data, key_end)[0]
        if key.endswith(".block_count"):
            assert kind == _UINT32, f"{key} is of GGUF type {kind}"
            block_count_at = len(header) + key_end + 4 - pos
        if key == "general.alignment":
            alignment = struct.unpack_from("<I", data, key_end + 4)[0]
        end = _value_end(data, key_end + 4, kind)
        header += data[pos:end]
        pos = end
    assert block_count_at is not None, f"{source} has no <arch>.block_count"
    assert struct.unpack_from("<I", header, block_count_at)[0] >= blocks
    struct.pack_into("<I", header, block_count_at, blocks)
    infos = []
    for _ in range(tensor_count):
        name_end = _string_end(data, pos)
        dims = struct.unpack_from("<I", data, name_end)[0]
        info_end = name_end + 4 + 8 * dims + 4 + 8
        infos.append((data[pos + 8:name_end], data[pos:info_end - 8], struct.unpack_from("<Q", data, info_end - 8)[0]))
        pos = info_end
    data_start = -(-pos // alignment) * alignment
    offsets = sorted(offset for _, _, offset in infos) + [len(data) - data_start]
    size_of = {offset: offsets[i + 1] - offset for i, offset in enumerate(offsets[:-1])}
    kept = [(name, info, offset) for name, info, offset in infos
            if not (_BLOCK.match(name) and int(_BLOCK.match(name).group(1)) >= blocks)]
    struct.pack_into("<Q", header, 8, len(kept))
    body, next_offset = bytearray(), 0
    for _, info, offset in kept:
        body += info + struct.pack("<Q", next_offset)
        next_offset += -(-size_of[offset] // alignment) * alignment
    out = header + body
    out += b"\0" * (-len(out) % alignment)
    for _, _, offset in kept:
        chunk = data[data_start + offset:data_start + offset + size_of[offset]]
        out += chunk + b"\0" * (-len(chunk) % alignment)
    with open(target, "wb") as f:
        f.write(out)
    return target
