"""Quantized host slabs kept on disk between runs (``--host-weight-cache-dir``).

Quantizing a dense checkpoint to int8 / int4 / fp8 host weights reads and rewrites every byte at load; a
restart with the same checkpoint and options produces the same bytes. ``SlabCache`` keeps each slab's bytes in
``<dir>/<key>/<name>.slab`` beside ``<name>.json`` (its layout: every part's name, shape, dtype and offset),
where the key hashes what decides those bytes: the checkpoint's files (name, size, modification time and the
hash of their first MiB: the safetensors header, which names every tensor's dtype, shape and offsets), the host
format, the compute dtype, the tensor-parallel shard and this cache's format version. A slab is read back only
when its stored layout equals the one the weights would get now, straight into the NUMA-placed slab; a miss,
a short file or an unreadable one quantizes as before. Writes go to a temporary file renamed into place, so
a run that dies mid-write leaves no slab that reads as complete. A full disk costs the cache, not the run.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import torch

log = logging.getLogger(__name__)

CACHE_VERSION = 1
HEAD_BYTES = 1 << 20
READ_CHUNK = 32 << 20
CHECKPOINT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".json")


def checkpoint_identity(model_path: str) -> list[list]:
    """(name, size, mtime_ns, sha256 of the first MiB) of each file that makes up the checkpoint."""
    path = Path(model_path)
    files = sorted(p for p in path.iterdir() if p.suffix in CHECKPOINT_SUFFIXES) if path.is_dir() else [path]
    out = []
    for f in files:
        stat = f.stat()
        with open(f, "rb") as handle:
            head = hashlib.sha256(handle.read(HEAD_BYTES)).hexdigest()
        out.append([f.name, stat.st_size, stat.st_mtime_ns, head])
    return out


def layout_record(layout) -> dict:
    """What must match for stored bytes to be read back: every part's place, shape and dtype, and the total."""
    return {"nbytes": layout.nbytes,
            "parts": [[name, part, list(shape), str(dtype), offset] for name, part, shape, dtype, offset in layout.parts]}


class SlabCache:
    def __init__(self, root: str, model_path: str, host_format: str, compute_dtype: torch.dtype, shard: str = ""):
        identity = {"version": CACHE_VERSION, "checkpoint": checkpoint_identity(model_path),
                    "host_format": host_format, "compute_dtype": str(compute_dtype), "shard": shard}
        key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]
        self.dir = Path(root).expanduser() / key
        self.dir.mkdir(parents=True, exist_ok=True)
        manifest = self.dir / "MANIFEST.json"
        if not manifest.exists():
            manifest.write_text(json.dumps({"model": os.path.abspath(model_path), **identity}, indent=1))
        self.hits = self.misses = 0
        self.bytes_read = 0

    def read(self, name: str, layout, into: torch.Tensor, workers: int = 1) -> bool:
        """Fill ``into`` (uint8, ``layout.nbytes``) with slab ``name``'s stored bytes, in chunks read by ``workers``
        threads (the copy out of the page cache and the first touch of ``into``'s pages are the cost, and both
        spread over cores); False (nothing usable) on a miss, a different layout or a short file."""
        data, meta = self.dir / f"{name}.slab", self.dir / f"{name}.json"
        try:
            if json.loads(meta.read_text()) != layout_record(layout) or data.stat().st_size != layout.nbytes:
                self.misses += 1
                return False
            got = _read_file(data, memoryview(into.numpy()), workers)
        except (OSError, ValueError):
            self.misses += 1
            return False
        if got != layout.nbytes:
            self.misses += 1
            return False
        self.hits += 1
        self.bytes_read += got
        return True

    def write(self, name: str, layout, data: torch.Tensor) -> None:
        """Store slab ``name``'s bytes and layout; a failure (e.g. a full disk) is logged and leaves no entry."""
        paths = [(self.dir / f"{name}.slab", memoryview(data.numpy())),
                 (self.dir / f"{name}.json", json.dumps(layout_record(layout)).encode())]
        try:
            for path, payload in paths:
                tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
                with open(tmp, "wb") as f:
                    f.write(payload)
                os.replace(tmp, path)
        except OSError as err:
            log.warning("could not keep host slab %s in %s (%s); the next start quantizes it again", name,
                        self.dir, err)
            for path, _ in paths:
                path.unlink(missing_ok=True)


def _read_file(path: Path, into: memoryview, workers: int) -> int:
    """Bytes of ``path`` read into ``into`` (as many as both hold), ``READ_CHUNK`` at a time on ``workers`` threads
    (``os.preadv`` releases the GIL)."""
    from concurrent.futures import ThreadPoolExecutor
    fd = os.open(path, os.O_RDONLY)
    try:
        starts = range(0, len(into), READ_CHUNK)

        def chunk(start: int) -> int:
            view, done = into[start:start + READ_CHUNK], 0
            while done < len(view):
                got = os.preadv(fd, [view[done:]], start + done)
                if got == 0:
                    break
                done += got
            return done
        if workers <= 1 or len(starts) <= 1:
            return sum(chunk(s) for s in starts)
        with ThreadPoolExecutor(min(workers, len(starts))) as pool:
            return sum(pool.map(chunk, starts))
    finally:
        os.close(fd)
