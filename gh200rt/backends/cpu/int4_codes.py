"""int4 codes widened to a byte each, for the native quantized linear on CPUs whose vector units bound a row.

One row through an int4 ``PackedWeight`` (a GGUF Q4_0 / Q4_1 checkpoint's blocks, ``OneRowBlocksWeight``) spends
more on unpacking nibbles than the half bytes save where the vector units are narrow: on a first-generation Zen
(AVX2 on 128-bit units) SmolLM2's int4 linears run at 5.5-8.1 GB/s where the same shapes as int8 run at 8.7-14.4,
faster in time though they read 1.35x the bytes (docs/BENCHMARKS.md). ``widen(weight)`` gives the weight's native
argument block (``native_args.quant_weight_args``) a copy of its codes as int8 ``q - 8`` laid out in the kernel's
chunk order (per 32 columns: the 16 even ones, then the 16 odd ones, as a byte's low and high nibbles come out), so
the kernel loads them as it loads int8 codes and fills the same integer lanes as from the nibbles: the same bits
(kernels/cpu/quant_linear.c, fmt 2), half a byte more per weight.

``widening_pays()`` decides once per process by timing one row through both forms of a random int4 weight on this
machine's threads (tens of milliseconds), as a 10% margin must show; the start-up log gives both times.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import time

import torch

from gh200rt.backends.cpu.native_args import CHUNK_COLUMNS, WeightArgs

log = logging.getLogger(__name__)

WIDENED_FMT = 2          # quant_linear.c's fmt of widened int4 codes
MARGIN = 1.10            # how much faster the widened form must be to be taken
PROBE_SHAPE = (1536, 1536)   # 2.4 M weights: past the caches of a small core, as a model's linears are


class WidenedInt4:
    """The argument block of an int4 ``PackedWeight`` over its widened codes (``codes``: int8 ``[N, K]``)."""
    __slots__ = ("codes", "args", "pointer")

    def __init__(self, weight):
        assert weight.fmt == "int4" and weight.minimum is not None, weight
        n, k = weight.shape
        assert k % CHUNK_COLUMNS == 0 and weight.group_size % CHUNK_COLUMNS == 0, weight
        chunks = weight.qweight.view(n, k // CHUNK_COLUMNS, CHUNK_COLUMNS // 2)
        low, high = (chunks & 0x0F).to(torch.int8) - 8, (chunks >> 4).to(torch.int8) - 8
        self.codes = torch.cat([low, high], dim=-1).reshape(n, k).contiguous()
        self.args = WeightArgs(self.codes.data_ptr(), weight.scale.data_ptr(), weight.minimum.data_ptr(),
                               WIDENED_FMT, n, k, weight.group_size)
        self.pointer = ctypes.addressof(self.args)


def widen(weight) -> None:
    """Point ``weight``'s native argument block at widened codes (kept on the weight: ``derived``; counted in its
    ``nbytes``)."""
    assert weight.stable, "a weight whose storage changes between calls keeps nothing derived from it"
    widened = WidenedInt4(weight)
    weight.derived["native_args"] = widened
    weight.derived["widened_codes"] = (widened.codes,)


def widened_bytes(n: int, k: int) -> int:
    """The bytes ``widen`` adds to an int4 ``[n, k]`` weight."""
    return n * k


@functools.lru_cache(maxsize=None)
def widening_pays(threads: int | None = None) -> bool:
    """Whether one row through widened int4 codes beats the nibbles by ``MARGIN`` here (on ``threads``, default
    torch's), timed on a random weight of ``PROBE_SHAPE``; False without the native library."""
    from gh200rt.backends.cpu.native import load_native_ops
    from gh200rt.formats.pack import pack_weight
    ops = load_native_ops()
    if ops is None:
        return False
    gen = torch.Generator().manual_seed(0)
    weight = pack_weight(torch.randn(PROBE_SHAPE, generator=gen), "int4")
    wide = pack_weight(torch.randn(PROBE_SHAPE, generator=gen), "int4")
    widen(wide)
    x = torch.randn(1, PROBE_SHAPE[1], generator=gen)
    saved = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        times = {"nibbles": [], "widened": []}
        for _ in range(5):             # alternated, the best of each
            for name, w in (("nibbles", weight), ("widened", wide)):
                ops.quant_linear(x, w)
                start = time.perf_counter()
                for _ in range(10):
                    ops.quant_linear(x, w)
                times[name].append((time.perf_counter() - start) / 10)
    finally:
        torch.set_num_threads(saved)
    nibbles, widened = min(times["nibbles"]), min(times["widened"])
    pays = nibbles >= MARGIN * widened
    log.info("int4 codes for single rows: %s (one row through a %dx%d weight: nibbles %.0f us, widened to bytes "
             "%.0f us)", "widened to bytes" if pays else "kept as nibbles", *PROBE_SHAPE, nibbles * 1e6,
             widened * 1e6)
    return pays
