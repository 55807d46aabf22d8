"""A Prometheus histogram (cumulative buckets, sum, count) in the text format, without dependencies."""
from __future__ import annotations

import bisect

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0)
PREFIX = "gh200rt"


def one_two_five(limit: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``limit`` (vLLM's token-count buckets)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > limit:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


class Histogram:
    def __init__(self, name: str, help_text: str, buckets=LATENCY_BUCKETS):
        self.name, self.help, self.buckets = name, help_text, tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.total = 0.0
        self.n = 0

    def snapshot(self) -> "Histogram":
        """A copy that later observations leave as it is."""
        copy = Histogram(self.name, self.help, self.buckets)
        copy.counts, copy.total, copy.n = list(self.counts), self.total, self.n
        return copy

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1

    def render(self, full: str | None = None, labels: str = "") -> list[str]:
        """Prometheus lines under ``full`` (default gh200rt_<name>); ``labels``: 'k="v",...' for every series."""
        full = full or f"{PREFIX}_{self.name}"
        sep = f"{labels}," if labels else ""
        lines = [f"# HELP {full} {self.help}", f"# TYPE {full} histogram"]
        running = 0
        for bound, count in zip(self.buckets, self.counts):
            running += count
            lines.append(f'{full}_bucket{{{sep}le="{bound}"}} {running}')
        lines.append(f'{full}_bucket{{{sep}le="+Inf"}} {self.n}')
        braces = f"{{{labels}}}" if labels else ""
        lines += [f"{full}_sum{braces} {self.total}", f"{full}_count{braces} {self.n}"]
        return lines


