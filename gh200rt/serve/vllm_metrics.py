"""The same measurements under vLLM's metric names (``vllm:...``, labelled with ``model_name``), so
Grafana dashboards and alerts written for vLLM work unchanged; gh200rt's own names stay beside them.
``m`` is the ServerMetrics, whose lock the caller holds."""
from __future__ import annotations



def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def vllm_lines(m, model_name: str) -> list[str]:
    labels = f'model_name="{_escape(model_name)}"'
    s = m.engine_stats
    get = lambda name, default=0: getattr(s, name, default) if s is not None else default  # noqa: E731
    total_blocks = get("kv_blocks_total")
    usage = get("kv_blocks_used") / total_blocks if total_blocks else 0.0
    series = [
        ("num_requests_running", "gauge", "Number of requests in model execution batches.", get("num_running")),
        ("num_requests_waiting", "gauge", "Number of requests waiting to be processed.", get("num_waiting")),
        ("gpu_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", usage),
        ("kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", usage),
        ("num_preemptions_total", "counter", "Cumulative number of preemptions.", get("num_preemptions")),
        ("prompt_tokens_total", "counter", "Number of prefill tokens processed.", m.counters["prompt_tokens_total"]),
        ("generation_tokens_total", "counter", "Number of generation tokens processed.",
         m.counters["generation_tokens_total"]),
        ("request_success_total", "counter", "Count of successfully processed requests.",
         m.counters["requests_success_total"]),
        ("prefix_cache_queries_total", "counter", "Prefix cache lookups.", get("prefix_cache_lookups")),
        ("prefix_cache_hits_total", "counter", "Prefix cache lookups that hit.", get("prefix_cache_hits")),
    ]
    lines = []
    for name, kind, help_text, value in series:
        lines += [f"# HELP vllm:{name} {help_text}", f"# TYPE vllm:{name} {kind}", f"vllm:{name}{{{labels}}} {value}"]
    for histogram, name in ((m.ttft, "time_to_first_token_seconds"), (m.itl, "time_per_output_token_seconds"),
                            (m.itl, "inter_token_latency_seconds"), (m.e2e, "e2e_request_latency_seconds")):
        lines += histogram.render(f"vllm:{name}", labels)
    return lines
