"""Decode batch buckets: 1, 2, 4, 8, then steps of 8 up to the largest graph batch (itself a bucket)."""
from __future__ import annotations

import bisect


def graph_buckets(max_batch: int) -> list[int]:
    assert max_batch >= 1, max_batch
    sizes = [b for b in (1, 2, 4, 8) if b <= max_batch] + list(range(16, max_batch + 1, 8))
    if sizes[-1] != max_batch:   # every batch up to max_batch has a bucket
        sizes.append(max_batch)
    return sizes


def bucket_for(batch: int, buckets: list[int]) -> int | None:
    """The smallest bucket that holds ``batch`` sequences; None above the largest."""
    i = bisect.bisect_left(buckets, batch)
    return buckets[i] if i < len(buckets) else None
