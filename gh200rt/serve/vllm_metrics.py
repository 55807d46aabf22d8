"""The same measurements under vLLM's metric names (``vllm:...``, labelled with ``model_name``), so
Grafana dashboards and alerts written for vLLM work unchanged; gh200rt's own names stay beside them.
``m`` is the ServerMetrics, whose lock the caller holds.

Request histograms (``VllmRequestHistograms``) are fed once per finished engine request from its
``RequestOutput.metrics`` (engine/outputs.py): queue, prefill, decode and inference times as vLLM defines
them, prompt and generation tokens, ``n`` and ``max_tokens``. ``vllm:iteration_tokens_total`` comes from the
engine's per-step histogram in its stats snapshot.
"""
from __future__ import annotations

import time

from gh200rt.engine.stats import iteration_tokens
from gh200rt.histogram import Histogram, one_two_five


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)   # vLLM's request_*_time buckets
FINISH_REASONS = ("stop", "length", "abort")


class VllmRequestHistograms:
    def __init__(self):
        tokens = one_two_five(1_000_000)
        times = {"queue": "Histogram of time spent in WAITING phase for request.",
                 "prefill": "Histogram of time spent in PREFILL phase for request.",
                 "decode": "Histogram of time spent in DECODE phase for request.",
                 "inference": "Histogram of time spent in RUNNING phase for request."}
        self.times = {phase: Histogram(f"request_{phase}_time_seconds", text, REQUEST_LATENCY_BUCKETS)
                      for phase, text in times.items()}
        self.prompt_tokens = Histogram("request_prompt_tokens", "Number of prefill tokens processed.", tokens)
        self.generation_tokens = Histogram("request_generation_tokens", "Number of generation tokens processed.",
                                           tokens)
        self.max_generation_tokens = Histogram("request_max_num_generation_tokens",
                                               "Histogram of maximum number of requested generation tokens.", tokens)
        self.params_n = Histogram("request_params_n", "Histogram of the n request parameter.", (1, 2, 5, 10, 20))
        self.params_max_tokens = Histogram("request_params_max_tokens", "Histogram of the max_tokens request "
                                           "parameter.", tokens)
        self.finished = dict.fromkeys(FINISH_REASONS, 0)

    def record(self, output, params) -> None:
        """One finished engine request: its ``RequestOutput`` (with ``metrics``) and ``SamplingParams``."""
        t = output.metrics
        if t is not None and t.first_scheduled_time is not None:
            self.times["queue"].observe(t.first_scheduled_time - t.arrival_time)
            if t.first_token_time is not None:
                self.times["prefill"].observe(t.first_token_time - t.first_scheduled_time)
                self.times["decode"].observe(t.last_token_time - t.first_token_time)
                self.times["inference"].observe(t.last_token_time - t.first_scheduled_time)
        self.prompt_tokens.observe(len(output.prompt_token_ids))
        generated = [len(c.token_ids) for c in output.outputs]
        self.generation_tokens.observe(sum(generated))
        self.max_generation_tokens.observe(max(generated, default=0))
        self.params_n.observe(params.n)
        if params.max_tokens is not None:
            self.params_max_tokens.observe(params.max_tokens)
        reason = output.outputs[0].finish_reason if output.outputs else None
        self.finished[reason if reason in self.finished else "abort"] += 1

    def pooled(self, output) -> None:
        """One finished embedding request (an ``EmbeddingRequestOutput``): queued, then running until its input is
        prefilled; it generates nothing and ends with "stop", as vLLM counts a pooling request."""
        t = output.metrics
        if t is not None and t.first_scheduled_time is not None:
            self.times["queue"].observe(t.first_scheduled_time - t.arrival_time)
            self.times["prefill"].observe(t.finished_time - t.first_scheduled_time)
            self.times["inference"].observe(t.finished_time - t.first_scheduled_time)
        self.prompt_tokens.observe(len(output.prompt_token_ids))
        self.finished["stop"] += 1

    def aborted(self) -> None:
        self.finished["abort"] += 1

    def render(self, labels: str) -> list[str]:
        lines = []
        for h in (*self.times.values(), self.prompt_tokens, self.generation_tokens, self.max_generation_tokens,
                  self.params_n, self.params_max_tokens):
            lines += h.render(f"vllm:{h.name}", labels)
        lines += ["# HELP vllm:request_success_total Count of successfully processed requests.",
                  "# TYPE vllm:request_success_total counter"]
        lines += [f'vllm:request_success_total{{{labels},finished_reason="{r}"}} {n}'
                  for r, n in self.finished.items()]
        return lines


def _iteration_tokens(histogram: Histogram | None, labels: str) -> list[str]:
    return (histogram or iteration_tokens()).render("vllm:iteration_tokens_total", labels)


def vllm_lines(m, model_name: str, cache_info: dict | None = None) -> list[str]:
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
        ("prefix_cache_queries_total", "counter", "Prefix cache lookups.", get("prefix_cache_lookups")),
        ("prefix_cache_hits_total", "counter", "Prefix cache lookups that hit.", get("prefix_cache_hits")),
    ]
    host = get("kv_host", None)
    if host is not None:   # the host KV tier is vLLM's external prefix cache (a KV connector's), counted in tokens
        series += [("external_prefix_cache_queries_total", "counter",
                    "External prefix cache queries from KV connector cross-instance cache sharing, in terms of "
                    "number of queried tokens.", host.queried_tokens),
                   ("external_prefix_cache_hits_total", "counter",
                    "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number "
                    "of cached tokens.", host.hit_tokens)]
    spec = get("spec_decode", None)
    if spec is not None:   # vLLM's speculative decoding counters
        series += [("spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.", spec.num_drafts),
                   ("spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.",
                    spec.num_draft_tokens),
                   ("spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.",
                    spec.num_accepted_tokens)]
    lines = []
    for name, kind, help_text, value in series:
        lines += [f"# HELP vllm:{name} {help_text}", f"# TYPE vllm:{name} {kind}", f"vllm:{name}{{{labels}}} {value}"]
    if spec is not None:
        lines += ["# HELP vllm:spec_decode_num_accepted_tokens_per_pos Accepted tokens per draft position.",
                  "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter"]
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos{{{labels},position="{j}"}} {n}'
                  for j, n in enumerate(spec.accepted_per_pos)]
    # every waiting request waits for capacity (KV blocks or a batch slot): nothing is deferred for other reasons
    lines += ["# HELP vllm:num_requests_waiting_by_reason Number of requests waiting, by the reason they wait.",
              "# TYPE vllm:num_requests_waiting_by_reason gauge",
              f'vllm:num_requests_waiting_by_reason{{{labels},reason="capacity"}} {get("num_waiting")}',
              f'vllm:num_requests_waiting_by_reason{{{labels},reason="deferred"}} 0']
    if cache_info:
        info = ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(cache_info.items()))
        lines += ["# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig.",
                  "# TYPE vllm:cache_config_info gauge", f"vllm:cache_config_info{{{labels},{info}}} 1.0"]
    for histogram, name in ((m.ttft, "time_to_first_token_seconds"), (m.itl, "time_per_output_token_seconds"),
                            (m.itl, "inter_token_latency_seconds"), (m.e2e, "e2e_request_latency_seconds")):
        lines += histogram.render(f"vllm:{name}", labels)
    lines += m.vllm_requests.render(labels)
    lines += _iteration_tokens(get("iteration_tokens", None), labels)
    lines += _lora_info(s)
    return lines


def _lora_info(s) -> list[str]:
    """vLLM's ``vllm:lora_requests_info``, only with ``--enable-lora``: the adapters of the running and of the
    waiting requests (names, comma-separated) and ``max_lora`` as labels, the time of the snapshot as the value (a
    scraper keeps the series with the latest value). No ``model_name`` label, as in vLLM."""
    max_loras = getattr(s, "max_loras", None)
    if max_loras is None:
        return []
    info = (f'max_lora="{max_loras}",running_lora_adapters="{_escape(",".join(s.running_lora_adapters))}",'
            f'waiting_lora_adapters="{_escape(",".join(s.waiting_lora_adapters))}"')
    return ["# HELP vllm:lora_requests_info Running stats on lora requests.",
            "# TYPE vllm:lora_requests_info gauge", f"vllm:lora_requests_info{{{info}}} {time.time()}"]
