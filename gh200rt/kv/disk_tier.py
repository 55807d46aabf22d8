"""The host KV tier's third level on local disk (``--kv-offloading-disk-dir``): blocks that survive a restart.

Every block the host tier stores is also written to a file of its own by the copy thread, after its host copy (so a
step never waits for a disk write). A lookup that ends in host memory continues here: each block is confirmed against
its tokens and its parent exactly as the host tier confirms them, then read into a host slot, from where it is loaded
like any host block. The directory keeps the least recently used blocks out beyond ``--kv-offloading-disk-size``.

A block is found again after a restart only under a hash that is the same in every process (``--prefix-caching-hash-
algo sha256``, required), and only by an engine whose blocks have the same layout: ``manifest.json`` holds what
fixes it (the model, the KV dtype and block shape, the block size, the hash), and an engine that differs refuses the
directory rather than read blocks of another model.

A block's file: ``MAGIC``, its hash, its parent (kind and value) and its tokens (``HEADER`` and int64s), then the
block's bytes. A file is written under a temporary name and renamed, so a crash leaves no partial block.
"""
from __future__ import annotations

import json
import logging
import os
import struct
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

MAGIC = b"GHKVBLK1"
HEADER = struct.Struct("<8s16s B 16s I")      # magic, hash, parent kind (0 salt, 1 hash), parent value, tokens
MANIFEST = "manifest.json"
SUFFIX = ".kv"


def _int16(value: int) -> bytes:
    return value.to_bytes(16, "little", signed=True)


def _from16(raw: bytes) -> int:
    return int.from_bytes(raw, "little", signed=True)


@dataclass
class DiskBlock:
    path: Path
    token_ids: tuple[int, ...]
    parent: tuple[str, int]


@dataclass
class DiskTierStats:
    hits: int = 0                # lookups that found at least one block on disk
    hit_blocks: int = 0
    written_blocks: int = 0
    written_bytes: int = 0
    read_bytes: int = 0
    read_seconds: float = 0.0
    evicted_blocks: int = 0
    failed_writes: int = 0
    failed_reads: int = 0        # files gone or damaged when read (forgotten; their tokens recomputed)


class DiskTier:
    """The blocks on disk, by hash (least recently used first); ``identity`` what the manifest must match."""

    def __init__(self, directory: str | Path, capacity_bytes: int, block_bytes: int, block_size: int, identity: dict):
        self.directory = Path(directory)
        self.block_bytes = block_bytes
        self.file_bytes = HEADER.size + 8 * block_size + block_bytes
        self.capacity_blocks = max(1, capacity_bytes // self.file_bytes)
        self.blocks: OrderedDict[int, DiskBlock] = OrderedDict()
        self.lock = threading.Lock()
        self.stats = DiskTierStats()
        self.directory.mkdir(parents=True, exist_ok=True)
        self._check_manifest(identity)
        self._scan()

    def _check_manifest(self, identity: dict) -> None:
        path = self.directory / MANIFEST
        if path.is_file():
            found = json.loads(path.read_text())
            if found != identity:
                differs = sorted(k for k in set(found) | set(identity) if found.get(k) != identity.get(k))
                what = ", ".join(f"{k}: {found.get(k)!r} there, {identity.get(k)!r} here" for k in differs)
                raise ValueError(f"--kv-offloading-disk-dir {self.directory} holds KV blocks of another model or "
                                 f"layout ({what}); give an empty directory or another one")
        else:
            path.write_text(json.dumps(identity, indent=1, sort_keys=True))

    def _scan(self) -> None:
        """The blocks a previous engine left, oldest first (by their files' times); unreadable files are skipped."""
        files = sorted(self.directory.glob(f"*{SUFFIX}"), key=lambda p: p.stat().st_mtime)
        for path in files:
            try:
                with open(path, "rb") as f:
                    block_hash, block = self._read_header(f, path)
            except (OSError, ValueError) as err:
                log.warning("KV disk tier: skipping %s (%s)", path, err)
                continue
            self.blocks[block_hash] = block
        while len(self.blocks) > self.capacity_blocks:
            self._evict_oldest()
        if self.blocks:
            log.info("KV disk tier: %d blocks found in %s", len(self.blocks), self.directory)

    def _read_header(self, f, path: Path) -> tuple[int, DiskBlock]:
        raw = f.read(HEADER.size)
        if len(raw) != HEADER.size:
            raise ValueError("shorter than a block's header")
        magic, block_hash, kind, value, count = HEADER.unpack(raw)
        if magic != MAGIC:
            raise ValueError("not a KV block file")
        tokens = np.frombuffer(f.read(8 * count), dtype=np.int64)
        if len(tokens) != count:
            raise ValueError("its tokens are cut short")
        return _from16(block_hash), DiskBlock(path, tuple(int(t) for t in tokens),
                                              ("hash" if kind else "salt", _from16(value)))

    def _path(self, block_hash: int) -> Path:
        return self.directory / f"{block_hash & (2**128 - 1):032x}{SUFFIX}"

    def _evict_oldest(self) -> None:
        _, block = self.blocks.popitem(last=False)
        block.path.unlink(missing_ok=True)
        self.stats.evicted_blocks += 1

    def forget(self, block_hash: int) -> None:
        """Drop a block whose file could not be read: no lookup finds it again."""
        with self.lock:
            block = self.blocks.pop(block_hash, None)
        if block is not None:
            block.path.unlink(missing_ok=True)

    def contains(self, block_hash: int) -> bool:
        with self.lock:
            return block_hash in self.blocks

    def write(self, block_hash: int, token_ids: tuple[int, ...], parent: tuple[str, int], data: np.ndarray) -> None:
        """Keep a block's bytes (``data``: uint8) on disk (the copy thread; a failure is logged, never raised)."""
        if self.contains(block_hash):
            return
        path = self._path(block_hash)
        tmp = path.with_suffix(".tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(HEADER.pack(MAGIC, _int16(block_hash), 1 if parent[0] == "hash" else 0, _int16(parent[1]),
                                    len(token_ids)))
                f.write(np.asarray(token_ids, dtype=np.int64).tobytes())
                f.write(memoryview(data))
            os.replace(tmp, path)
        except OSError as err:
            self.stats.failed_writes += 1
            tmp.unlink(missing_ok=True)
            if self.stats.failed_writes == 1:
                log.warning("KV disk tier: a block could not be written to %s (%s); blocks not written are "
                            "recomputed after a restart", self.directory, err)
            return
        with self.lock:
            self.blocks[block_hash] = DiskBlock(path, tuple(token_ids), parent)
            self.stats.written_blocks += 1
            self.stats.written_bytes += len(data)
            while len(self.blocks) > self.capacity_blocks:
                self._evict_oldest()

    def lookup(self, block_hash: int, chunk: tuple[int, ...], parent: tuple[str, int]) -> DiskBlock | None:
        """The block of ``block_hash`` if it holds ``chunk`` under ``parent`` (marked recently used), else None."""
        with self.lock:
            block = self.blocks.get(block_hash)
            if block is None or block.token_ids != chunk or block.parent != parent:
                return None
            self.blocks.move_to_end(block_hash)
            return block

    def read_into(self, block: DiskBlock, out: np.ndarray) -> bool:
        """``block``'s bytes into ``out`` (uint8, the block's size); False where the file is gone or damaged."""
        started = time.perf_counter()
        try:
            with open(block.path, "rb") as f:
                self._read_header(f, block.path)
                if f.readinto(memoryview(out)) != self.block_bytes:
                    raise ValueError("its bytes are cut short")
        except (OSError, ValueError) as err:
            log.warning("KV disk tier: %s cannot be read (%s); its tokens are recomputed", block.path, err)
            self.stats.failed_reads += 1
            return False
        self.stats.read_seconds += time.perf_counter() - started
        self.stats.read_bytes += self.block_bytes
        return True


def disk_capacity_bytes(directory: str | Path, size_gib: float | None) -> int:
    """``--kv-offloading-disk-size`` in bytes, or half the free space of the directory's filesystem."""
    if size_gib is not None:
        return int(size_gib * 2**30)
    Path(directory).mkdir(parents=True, exist_ok=True)
    stat = os.statvfs(directory)
    return stat.f_bavail * stat.f_frsize // 2
