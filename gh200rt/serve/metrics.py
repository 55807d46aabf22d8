"""Prometheus text-format metrics without extra dependencies.

Counters and histograms are updated from the asyncio loop (request side); engine gauges come
from the latest ``EngineStats`` snapshot the engine thread publishes, so /metrics never touches
the single-threaded engine itself.
"""
from __future__ import annotations

import bisect
import threading

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0)
PREFIX = "gh200rt"


class Histogram:
    def __init__(self, name: str, help_text: str, buckets=LATENCY_BUCKETS):
        self.name, self.help, self.buckets = name, help_text, tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1

    def render(self) -> list[str]:
        full = f"{PREFIX}_{self.name}"
        lines = [f"# HELP {full} {self.help}", f"# TYPE {full} histogram"]
        running = 0
        for bound, count in zip(self.buckets, self.counts):
            running += count
            lines.append(f'{full}_bucket{{le="{bound}"}} {running}')
        lines.append(f'{full}_bucket{{le="+Inf"}} {self.n}')
        lines += [f"{full}_sum {self.total}", f"{full}_count {self.n}"]
        return lines


class ServerMetrics:
    def __init__(self):
        self._lock = threading.Lock()
        self.counters = {"requests_received_total": 0, "requests_success_total": 0,
                         "requests_aborted_total": 0, "requests_rejected_total": 0,
                         "prompt_tokens_total": 0, "generation_tokens_total": 0}
        self.ttft = Histogram("time_to_first_token_seconds", "Time from request arrival to its first token.")
        self.itl = Histogram("inter_token_latency_seconds", "Time between consecutive output chunks of a request.")
        self.e2e = Histogram("e2e_request_latency_seconds", "Time from request arrival to its last token.")
        self.engine_stats = None

    def count(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self.counters[name] += amount

    def observe(self, histogram: Histogram, value: float) -> None:
        with self._lock:
            histogram.observe(value)

    def render(self, num_pending: int) -> str:
        with self._lock:
            lines = []
            for name, value in self.counters.items():
                full = f"{PREFIX}_{name}"
                lines += [f"# TYPE {full} counter", f"{full} {value}"]
            for h in (self.ttft, self.itl, self.e2e):
                lines += h.render()
        s = self.engine_stats
        running = s.num_running if s else 0
        waiting = s.num_waiting if s else 0
        gauges = {
            "num_requests_running": (running, "Sequences the scheduler is running."),
            "num_requests_waiting": (waiting, "Sequences waiting for KV blocks or a batch slot."),
            "num_requests_pending": (num_pending, "Requests accepted by the server and not finished."),
            "kv_blocks_total": (s.kv_blocks_total if s else 0, "KV cache blocks in the pool."),
            "kv_blocks_used": (s.kv_blocks_used if s else 0, "KV cache blocks held by requests."),
            "prefix_cache_lookups_total": (s.prefix_cache_lookups if s else 0, "Prefix cache lookups."),
            "prefix_cache_hits_total": (s.prefix_cache_hits if s else 0, "Prefix cache lookups that hit."),
            "prefix_cache_hit_rate": ((s.prefix_cache_hits / s.prefix_cache_lookups)
                                      if s and s.prefix_cache_lookups else 0.0, "Prefix cache hits / lookups."),
            "num_preemptions_total": (s.num_preemptions if s else 0, "Sequences preempted for KV space."),
        }
        for name, (value, help_text) in gauges.items():
            full = f"{PREFIX}_{name}"
            lines += [f"# HELP {full} {help_text}", f"# TYPE {full} gauge", f"{full} {value}"]
        return "\n".join(lines) + "\n"
