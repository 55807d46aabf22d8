"""A row-wise function (a linear, the logits head) computed on blocks of a fixed number of rows, so that a row's
bits do not depend on the rows computed beside it.

A GEMM library picks its kernel, and so the order in which it sums a row, from the shape of the call: on an AMX
CPU oneDNN's bf16 inner product sums a row one way up to 32 rows and another way above, MKL's AVX2 kernels (what
AMD CPUs run) by the row count mod 6, and the CPU routes send a few rows to native kernels and more to oneDNN or
fbgemm (docs/BENCHMARKS.md, prefix-cache invariance). Cut into blocks of exactly ``rows`` rows, the last padded
with zero rows, a call gives a row the same bits whichever rows share it and wherever the row sits, provided the
kernel computes every row of one call alike: a prompt position then computes alike in a full prefill, after a
cached prefix, in any prefill chunk and beside any other requests.

**Larger blocks where they give the same bits.** Blocks of 64 rows cost prefill throughput: oneDNN runs a 64-row
call at a third of a 1,000-row call's rate. For most shapes a kernel sums a row the same way at 64 rows as at
2,048, which cannot be known from outside but can be seen: ``RowBlockSizes`` probes each linear route (its
weight's format, shape and dtype, the activations' dtype, the thread count) once per process, at its first
blocked call, and keeps the sizes of the ladder ``rows * 2^i`` (up to ``MAX_BLOCK_ROWS``) at which the probe rows
get exactly the base block's bits, at spread positions. A call then cuts its rows into blocks of those sizes only
(``block_cuts``): every row of every call is computed at a size whose bits are the base size's. Random probe data
makes a different summation order show with near certainty (K of 64 and more products per row).

**Smaller blocks for short calls.** A call of fewer rows than the base (a prompt's last tokens after its cached
prefix, a short chunk) would pay for a whole padded base block: on fbgemm's fp16 GEMM a 64-row call takes ~3.5x a
16-row one. Such a call takes the smallest of the sizes ``base / 2^i`` (down to ``MIN_BLOCK_ROWS``) that holds
it, among those the probe finds giving the base block's bits (probe rows taken from the base block, in two
placements); a size where a route switches kernels (the native fp16 linear below 9 rows) is kept out.

The probe also checks that the base size itself computes every row alike (rows rolled by a few places give the
same bits). Where it does not, as MKL's AVX2 float32 kernels with few output columns do, the route's blocked
calls take one row each, with a warning (``linear.py`` keeps float32 linears off that route where oneDNN exists;
a small model's float32 logits head may take it).
"""
from __future__ import annotations

import logging
from typing import Callable, Hashable, Sequence

import torch

log = logging.getLogger(__name__)

# The largest block a blocked call is cut into: a default prefill step (max_num_batched_tokens 2048) in one call.
MAX_BLOCK_ROWS = 2048
# A block may be padded up to the next verified size when that adds at most this fraction of its rows (a bigger
# call's rate makes up for the padding); else the block takes the largest size it fills.
PAD_UP_FRACTION = 0.25
# How far the probe rolls the base block's rows to see whether a row's bits move with its place in the call.
POSITION_ROLL = 7
# The smallest block a call of fewer rows than the base may take (where the probe keeps it).
MIN_BLOCK_ROWS = 8


def in_row_blocks(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, rows: int,
                  cuts: Sequence[int] | None = None) -> torch.Tensor:
    """``fn(x)`` for a row-wise ``fn`` (``[M, K] -> [M, N]``, rows independent), computed as calls on blocks of
    ``x [..., K]`` of exactly ``rows`` rows, or of the sizes ``cuts`` lists in order (sizes at which ``fn`` gives a
    row the bits it gets at ``rows``, covering x's rows: ``RowBlockSizes.cuts``)."""
    assert rows > 0, rows
    flat = x.reshape(-1, x.shape[-1])
    count = flat.shape[0]
    if count == 0:
        return fn(x)
    cuts = list(cuts) if cuts is not None else block_cuts(count, (rows,))
    padded = sum(cuts)
    assert padded >= count > padded - cuts[-1], (count, cuts)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    blocks = list(flat[:padded - cuts[-1]].split(cuts[:-1])) if len(cuts) > 1 else []
    last = flat[padded - cuts[-1]:]
    if padded > count:      # only the last block is padded: the rows before it are not copied
        last = torch.cat([last, flat.new_zeros(padded - count, flat.shape[-1])])
    outs = [fn(block) for block in blocks + [last]]
    out = outs[0] if len(outs) == 1 else torch.cat(outs)
    return out[:count].reshape(*x.shape[:-1], out.shape[-1])


def block_cuts(count: int, sizes: Sequence[int]) -> list[int]:
    """The call sizes, each one of ``sizes`` (ascending), that cover ``count`` rows: the largest size while the
    rows fill it; then the smallest size that holds the rest, where that pads little (``PAD_UP_FRACTION``) or no
    more than taking the largest size the rest fills and cutting what is left alike."""
    assert count > 0 and sizes and list(sizes) == sorted(set(sizes)), (count, sizes)
    cuts = []
    left = count
    while left >= sizes[-1]:
        cuts.append(sizes[-1])
        left -= sizes[-1]
    if left == 0:
        return cuts
    up = next(s for s in sizes if s >= left)
    if up == sizes[0] or up - left <= left * PAD_UP_FRACTION:
        return cuts + [up]
    down = max(s for s in sizes if s <= left)
    rest = [down] + (block_cuts(left - down, sizes) if left > down else [])
    return cuts + ([up] if sum(rest) >= up else rest)


def ladder(rows: int, max_rows: int = MAX_BLOCK_ROWS) -> tuple[int, ...]:
    """The candidate block sizes above base ``rows``: ``rows * 2^i`` up to ``max_rows``."""
    sizes = [rows]
    while sizes[-1] * 2 <= max_rows:
        sizes.append(sizes[-1] * 2)
    return tuple(sizes)


def smaller_sizes(rows: int, min_rows: int = MIN_BLOCK_ROWS) -> tuple[int, ...]:
    """The candidate block sizes below base ``rows`` for calls of fewer rows: ``rows / 2^i`` down to ``min_rows``,
    ascending."""
    sizes = []
    while rows % 2 == 0 and rows // 2 >= min_rows:
        rows //= 2
        sizes.append(rows)
    return tuple(reversed(sizes))


class _Probe:
    """``rows`` random probe rows of ``k`` columns. It keeps no function: each check takes the route's function of the
    call that asks (whatever weight of the route it multiplies by), and compares a base call with a larger one of that
    same function. A probe kept for the process must not hold a layer's weight alive (a closed engine's host slab
    would stay mapped)."""

    def __init__(self, k: int, dtype: torch.dtype, rows: int, seed: int = 0):
        self.rows = rows
        self.gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(rows, k, generator=self.gen).to(dtype)

    def position_free(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> bool:
        """Whether the base call computes its rows alike wherever they sit (rolled by a few places)."""
        shift = POSITION_ROLL % self.rows if self.rows > 1 else 0
        return torch.equal(fn(self.x.roll(shift, 0)).roll(-shift, 0), fn(self.x))

    def same_bits_at(self, size: int, fn: Callable[[torch.Tensor], torch.Tensor]) -> bool:
        """Whether a ``size``-row call gives the probe rows the base call's bits, placed at positions spread over
        the call (first and last included) among other random rows."""
        if size == self.rows:
            return True
        if size < self.rows:     # some of the base rows alone, in two placements
            at = torch.linspace(0, self.rows - 1, size).round().long()
            base = fn(self.x)
            return all(torch.equal(fn(self.x[rows].contiguous()), base[rows]) for rows in (at, at.roll(1)))
        x = torch.randn(size, self.x.shape[1], generator=self.gen).to(self.x.dtype)
        at = torch.linspace(0, size - 1, self.rows).round().long()
        x[at] = self.x
        return torch.equal(fn(x)[at], fn(self.x))


def probe_sizes(fn: Callable[[torch.Tensor], torch.Tensor], k: int, dtype: torch.dtype, rows: int,
                candidates: Sequence[int], seed: int = 0) -> tuple[tuple[int, ...], bool]:
    """The sizes of ``candidates`` at which ``fn`` gives ``rows`` probe rows the bits of one ``rows``-row call
    (``rows`` among them, ascending), and whether that call computes its rows alike wherever they sit."""
    probe = _Probe(k, dtype, rows, seed)
    verified = tuple(sorted((rows, *(size for size in candidates if size != rows and probe.same_bits_at(size, fn)))))
    return verified, probe.position_free(fn)


class RowBlockSizes:
    """The block sizes each route a blocked call has taken in this process was found to keep a row's bits at
    (a route: whatever decides the kernel and so the summation order; the caller's key). A size is probed the
    first time a call would be cut into it, so a process pays only for the sizes its steps use."""

    def __init__(self, max_rows: int = MAX_BLOCK_ROWS):
        self.max_rows = max_rows
        self._found: dict[Hashable, dict[int, bool]] = {}    # key -> size -> gives the base bits
        self._probes: dict[Hashable, _Probe] = {}
        self.position_dependent: set[Hashable] = set()

    def cuts(self, route: Hashable, fn: Callable[[torch.Tensor], torch.Tensor], k: int, dtype: torch.dtype,
             rows: int, count: int) -> list[int]:
        """``block_cuts`` of ``count`` rows over the sizes that give ``rows``' bits (each size it would take probed
        first): the ladder from ``rows`` up, or for fewer rows than ``rows`` the sizes below it and ``rows``."""
        key = (route, k, dtype, rows, torch.get_num_threads())
        found = self._found.get(key)
        if found is None:
            probe = self._probes[key] = _Probe(k, dtype, rows)
            found = self._found[key] = {rows: probe.position_free(fn)}
            if not found[rows]:
                self.position_dependent.add(route)
                log.warning("route %s computes a row of a %d-row call differently by its place in the call: its "
                            "blocked calls take one row each (slow, exact)", route, rows)
        if not found[rows]:
            return [1] * count
        candidates = ladder(rows, self.max_rows) if count >= rows else (*smaller_sizes(rows), rows)
        while True:
            cuts = block_cuts(count, tuple(s for s in candidates if found.get(s, True)))
            unknown = sorted(set(cuts) - found.keys())
            if not unknown:
                return cuts
            for size in unknown:
                found[size] = self._probes[key].same_bits_at(size, fn)

    def verified(self, route: Hashable) -> dict[int, bool]:
        """Every size probed for ``route`` (any k, dtype, base and thread count) and whether it kept the bits."""
        out: dict[int, bool] = {}
        for key, found in self._found.items():
            if key[0] == route:
                out.update(found)
        return out

    def __len__(self) -> int:
        return len(self._found)
