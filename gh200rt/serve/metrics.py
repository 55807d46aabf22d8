"""Prometheus text-format metrics without extra dependencies.

Counters and histograms are updated from the asyncio loop (request side); engine gauges come
from the latest ``EngineStats`` snapshot the engine thread publishes, so /metrics never touches
the single-threaded engine itself. The server's own gauges (admission, event-loop tasks, resident
memory) are what a soak test watches for leaks (``python -m gh200rt.bench stress``).
"""
from __future__ import annotations

import os
import threading

from gh200rt.histogram import LATENCY_BUCKETS, Histogram  # noqa: F401  (Histogram: users import it here)
from gh200rt.serve.vllm_metrics import VllmRequestHistograms, vllm_lines
from gh200rt.weights.tiers import Tier

PREFIX = "gh200rt"


COUNTER_HELP = {
    "requests_received_total": "Requests received (completions, chat completions and embeddings).",
    "requests_success_total": "Requests that finished normally (completions, chat completions and embeddings).",
    "requests_aborted_total": "Requests aborted (client disconnect or error after acceptance).",
    "requests_rejected_total": "Requests refused before running (bad input or overload).",
    "prompt_tokens_total": "Prompt tokens of finished requests.",
    "generation_tokens_total": "Tokens generated.",
}
TIERS = tuple(tier.value for tier in Tier)
LAYER_TIERS = tuple(t for t in TIERS if t != Tier.CPU)


def _series(name: str, kind: str, help_text: str, samples: list[tuple[str, object]]) -> list[str]:
    full = f"{PREFIX}_{name}"
    return [f"# HELP {full} {help_text}", f"# TYPE {full} {kind}"] + [f"{full}{labels} {v}" for labels, v in samples]


class ServerMetrics:
    def __init__(self):
        self._lock = threading.Lock()
        self.counters = dict.fromkeys(COUNTER_HELP, 0)
        self.ttft = Histogram("time_to_first_token_seconds", "Time from request arrival to its first token.")
        self.itl = Histogram("inter_token_latency_seconds", "Time between consecutive output chunks of a request.")
        self.e2e = Histogram("e2e_request_latency_seconds", "Time from request arrival to its last token.")
        self.vllm_requests = VllmRequestHistograms()
        self.cache_info: dict | None = None      # vllm:cache_config_info's labels, once the engine is up
        self.engine_stats = None

    def count(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self.counters[name] += amount

    def observe(self, histogram: Histogram, value: float) -> None:
        with self._lock:
            histogram.observe(value)

    def request_finished(self, output, params) -> None:
        """A finished engine request (its last ``RequestOutput``): vLLM's per-request histograms."""
        with self._lock:
            self.vllm_requests.record(output, params)

    def request_pooled(self, output) -> None:
        """A finished embedding request (its ``EmbeddingRequestOutput``): vLLM's per-request histograms."""
        with self._lock:
            self.vllm_requests.pooled(output)

    def request_aborted(self) -> None:
        with self._lock:
            self.vllm_requests.aborted()

    def render(self, num_pending: int, model_name: str = "", admission=None, tasks: int | None = None) -> str:
        """``admission``: the server's Admission; ``tasks``: asyncio tasks alive in its event loop."""
        with self._lock:
            lines = []
            for name, value in self.counters.items():
                lines += _series(name, "counter", COUNTER_HELP[name], [("", value)])
            for h in (self.ttft, self.itl, self.e2e):
                lines += h.render()
            lines += vllm_lines(self, model_name, self.cache_info)
        lines += _engine_lines(self.engine_stats, num_pending)
        lines += server_lines(admission, tasks)
        return "\n".join(lines) + "\n"


# The host KV tier's series (--kv-offloading-size): name -> (report field, kind, help)
HOST_TIER_SERIES = {
    "kv_host_blocks_total": ("blocks_total", "gauge", "Blocks the host KV tier holds room for."),
    "kv_host_blocks_used": ("blocks_used", "gauge", "Host KV tier blocks holding a stored block."),
    "kv_host_queries_total": ("queries", "counter", "Lookups that continued in the host KV tier past the device "
                                                    "pool's hit."),
    "kv_host_hits_total": ("hits", "counter", "Host KV tier lookups that found at least one block."),
    "kv_host_queried_tokens_total": ("queried_tokens", "counter", "Prompt tokens looked up in the host KV tier."),
    "kv_host_hit_tokens_total": ("hit_tokens", "counter", "Prompt tokens loaded from the host KV tier instead of "
                                                          "recomputed."),
    "kv_host_stored_blocks_total": ("stored_blocks", "counter", "Blocks copied into the host KV tier."),
    "kv_host_loaded_blocks_total": ("loaded_blocks", "counter", "Blocks copied back from the host KV tier."),
    "kv_host_read_in_place_blocks_total": ("read_in_place_blocks", "counter", "Host KV tier blocks that requests' "
                                                                              "attention read in place instead of "
                                                                              "loading them."),
    "kv_host_dropped_stores_total": ("dropped_stores", "counter", "Stores dropped: the device block was reused "
                                                                  "first, or no host block was free."),
    "kv_host_evicted_blocks_total": ("evicted_blocks", "counter", "Host KV tier blocks evicted (least recently "
                                                                  "used) for newer ones."),
    "kv_host_stored_bytes_total": ("stored_bytes", "counter", "Bytes copied into the host KV tier."),
    "kv_host_loaded_bytes_total": ("loaded_bytes", "counter", "Bytes copied back from the host KV tier."),
    "kv_host_load_seconds_total": ("load_seconds", "counter", "Seconds steps waited for host KV tier loads."),
}


DISK_TIER_SERIES = {
    "kv_disk_hit_blocks_total": ("hit_blocks", "counter", "Blocks read back from the disk KV tier instead of "
                                                          "recomputed."),
    "kv_disk_written_blocks_total": ("written_blocks", "counter", "Blocks written to the disk KV tier."),
    "kv_disk_written_bytes_total": ("written_bytes", "counter", "Bytes written to the disk KV tier."),
    "kv_disk_read_bytes_total": ("read_bytes", "counter", "Bytes read back from the disk KV tier."),
    "kv_disk_read_seconds_total": ("read_seconds", "counter", "Seconds the disk KV tier's reader thread spent reading "
                                                              "blocks (no step waits for them)."),
    "kv_disk_failed_reads_total": ("failed_reads", "counter", "Disk KV tier files gone or damaged when read "
                                                              "(forgotten; their tokens recomputed)."),
    "kv_disk_evicted_blocks_total": ("evicted_blocks", "counter", "Disk KV tier blocks deleted (least recently used) "
                                                                  "beyond --kv-offloading-disk-size."),
}


def host_tier_lines(report) -> list[str]:
    """The host KV tier's series (and its disk tier's), none with the tier off."""
    if report is None:
        return []
    lines = []
    for name, (attr, kind, help_text) in HOST_TIER_SERIES.items():
        lines += _series(name, kind, help_text, [("", getattr(report, attr))])
    if report.disk is not None:
        lines += _series("kv_disk_blocks", "gauge", "Blocks the disk KV tier holds.", [("", report.disk_blocks)])
        lines += _series("kv_disk_reading_blocks", "gauge", "Blocks being read from disk into host memory now (their "
                         "requests wait for them).", [("", report.disk_reading)])
        for name, (attr, kind, help_text) in DISK_TIER_SERIES.items():
            lines += _series(name, kind, help_text, [("", getattr(report.disk, attr))])
    return lines


def _engine_lines(s, num_pending: int) -> list[str]:
    """Gauges and counters from the latest EngineStats snapshot (zeros before the model is loaded)."""
    get = lambda name, default=0: getattr(s, name, default) if s is not None else default  # noqa: E731
    lookups, hits = get("prefix_cache_lookups"), get("prefix_cache_hits")
    gauges = {
        "num_requests_running": (get("num_running"), "Sequences the scheduler is running."),
        "num_requests_waiting": (get("num_waiting"), "Sequences waiting for KV blocks or a batch slot."),
        "num_requests_pending": (num_pending, "Requests accepted by the server and not finished."),
        "kv_blocks_total": (get("kv_blocks_total"), "KV cache blocks in the pool."),
        "kv_blocks_used": (get("kv_blocks_used"), "KV cache blocks held by requests."),
        "prefix_cache_hit_rate": (hits / lookups if lookups else 0.0, "Prefix cache hits / lookups."),
        "graph_pool_bytes": (get("graph_pool_bytes"), "Device bytes of the decode graphs' shared memory pool."),
    }
    counters = {
        "prefix_cache_lookups_total": (lookups, "Prefix cache lookups."),
        "prefix_cache_hits_total": (hits, "Prefix cache lookups that hit."),
        "num_preemptions_total": (get("num_preemptions"), "Sequences preempted for KV space."),
        "weight_bytes_copied_total": (get("weight_bytes_copied"),
                                      "Bytes of streamed-tier weights copied into staging slots."),
        "copy_wait_seconds_total": (float(get("copy_wait_seconds", 0.0)),
                                    "Seconds the compute side waited for a staging copy to land."),
        "expert_bytes_copied_total": (get("expert_bytes_copied"),
                                      "Bytes of streamed routed experts copied in (only for the experts a step "
                                      "routes to)."),
        "graph_captures_total": (get("graph_captures"),
                                 "Decode graphs captured (one per batch bucket, again after each tier move)."),
        "steps_launched_ahead_total": (get("steps_launched_ahead"),
                                       "Steps launched before the previous step's tokens reached the host "
                                       "(--async-scheduling; with speculative decoding: before the previous step "
                                       "was reported)."),
        "rows_discarded_total": (get("rows_discarded"),
                                 "Rows of steps launched ahead whose sequence had stopped in the step before."),
    }
    lines = []
    for name, (value, help_text) in gauges.items():
        lines += _series(name, "gauge", help_text, [("", value)])
    for name, (value, help_text) in counters.items():
        lines += _series(name, "counter", help_text, [("", value)])
    lines += host_tier_lines(get("kv_host", None))
    spec = get("spec_decode", None)
    if spec is not None:
        lines += _series("spec_decode_num_speculative_tokens", "gauge",
                         "Tokens each decoding sequence drafted in the latest step (k; chosen per step with "
                         "num_speculative_tokens \"auto\").", [("", spec.current_k or 0)])
    tiers = get("layers_per_tier", None) or {}
    lines += _series("weight_layers", "gauge", "Decoder layers per weight tier (resident, streamed, direct).",
                     [(f'{{tier="{t}"}}', tiers.get(t, 0))
                      for t in (*LAYER_TIERS, *sorted(set(tiers) - set(LAYER_TIERS)))])
    experts = get("experts_per_tier", None) or {}
    if experts:
        lines += _series("moe_experts", "gauge", "An MoE model's routed experts per weight tier.",
                         [(f'{{tier="{t}"}}', experts.get(t, 0)) for t in TIERS])
        lines += _series("moe_expert_swaps_total", "counter",
                         "Resident experts swapped for more-used offloaded ones (--offload dynamic).",
                         [("", get("expert_swaps"))])
        cpu_tier = get("cpu_expert_tier", None) or {}
        if "cpu" in experts and experts["cpu"]:
            lines += _series("moe_cpu_tier_expert_runs_total", "counter",
                             "cpu-tier experts' runs (an expert with tokens in a layer's step), by where they ran: "
                             "the host's cores, or the device for a step that routed more than --moe-cpu-max-tokens.",
                             [(f'{{where="{w}"}}', cpu_tier.get("runs", {}).get(w, 0)) for w in ("cpu", "device")])
            lines += _series("moe_cpu_tier_routed_tokens_total", "counter",
                             "(token, choice) pairs routed to cpu-tier experts, by where they were computed.",
                             [(f'{{where="{w}"}}', cpu_tier.get("pairs", {}).get(w, 0)) for w in ("cpu", "device")])
        routed = get("routed_tokens", None) or {}
        lines += _series("moe_routed_tokens_total", "counter",
                         "(token, choice) pairs the router sent to each expert of each MoE layer.",
                         [(f'{{layer="{layer}",expert="{e}"}}', n) for layer, counts in sorted(routed.items())
                          for e, n in enumerate(counts)])
    retier = get("retier_counts", None) or {}
    lines += _series("retier_total", "counter", "Decoder layers moved between tiers at run time (--offload dynamic).",
                     [(f'{{direction="{d}"}}', retier.get(d, 0)) for d in ("promote", "demote")])
    lines += _series("arena_blocks", "gauge", "Device arena blocks held by resident layer weights and by the KV cache.",
                     [('{holder="weights"}', get("arena_weight_blocks")), ('{holder="kv"}', get("kv_blocks_total"))])
    return lines


def resident_memory_bytes() -> int | None:
    """This process's RSS from /proc (Linux); None elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def server_lines(admission, tasks: int | None) -> list[str]:
    """Admission (see ``admission``), the event loop's tasks and the process's RSS."""
    lines = []
    if admission is not None:
        lines += _series("admission_rejections_total", "counter",
                         "Generation requests refused with 503 because the server held its limit of sequences.",
                         [("", admission.refused)])
        lines += _series("admitted_sequences", "gauge",
                         "Sequences admitted (being tokenized, queued or running) and not finished.",
                         [("", admission.held)])
        lines += _series("admitted_sequences_limit", "gauge",
                         "Most sequences admitted at once (--max-num-seqs + --max-queued-requests, or "
                         "--max-num-queued-reqs); requests beyond it get 503.", [("", admission.limit)])
        lines += _series("retry_after_seconds", "gauge", "The Retry-After a request refused now would get.",
                         [("", admission.retry_after())])
    if tasks is not None:
        lines += _series("server_tasks", "gauge",
                         "asyncio tasks alive in the server's event loop (this scrape's own included).", [("", tasks)])
    rss = resident_memory_bytes()
    if rss is not None:
        lines += ["# HELP process_resident_memory_bytes Resident memory size in bytes.",
                  "# TYPE process_resident_memory_bytes gauge", f"process_resident_memory_bytes {rss}"]
    return lines
