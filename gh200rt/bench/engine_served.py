"""``throughput --engine-served``: the served workload of ``peers`` (N requests, 128 random tokens in / 64 out, C in
flight) driven on ``LLMEngine`` directly, without HTTP: what the engine alone achieves, to hold against the
served figure (the difference is the server's cost), and where the engine's time goes.

Reports output tok/s (wall), the engine's CPU seconds (less sensitive than wall time to other processes
on a shared machine), decode-only steps (count, p50 wall ms, weight bytes read per second against the
route's weight bytes) and steps that prefill (count, tokens, wall ms), and minor page faults per
prefill step.
"""
from __future__ import annotations

import os
import random
import resource
import time

import torch

from gh200rt.bench.models import smollm2_gguf
from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.sampling_params import SamplingParams


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def linear_weight_bytes(model) -> int:
    """Bytes of the decoder linears and the lm_head, which every decode step reads once."""
    refs = [r for i in range(len(model.layers)) for r in model.layer_weight_refs(i).values()]
    return sum(r.current.nbytes for r in refs + [model.lm_head.weight_ref])


def drive(engine: LLMEngine, prompts: list[list[int]], concurrency: int, max_tokens: int):
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    decode_ms, prefill = [], []                  # prefill: (tokens, ms, faults) per step that prefills
    nxt = in_flight = tokens = 0
    start, cpu0 = time.perf_counter(), time.process_time()
    while nxt < len(prompts) or engine.has_unfinished_requests():
        while in_flight < concurrency and nxt < len(prompts):
            engine.add_request(f"r{nxt}", None, params, prompt_token_ids=prompts[nxt])
            nxt, in_flight = nxt + 1, in_flight + 1
        seqs = [s for st in engine.requests.values() for s in st.seqs]
        uncomputed = sum(s.num_tokens - s.num_computed_tokens for s in seqs)
        faults, t = minor_faults(), time.perf_counter()
        outputs = engine.step()
        ms = 1000 * (time.perf_counter() - t)
        if uncomputed > len(seqs):
            prefill.append((uncomputed, ms, minor_faults() - faults))
        else:
            decode_ms.append(ms)
        for out in outputs:
            tokens += sum(len(c.delta_token_ids) for c in out.outputs)
            in_flight -= out.finished
    return tokens, time.perf_counter() - start, time.process_time() - cpu0, decode_ms, prefill


def run_engine_served(args) -> None:
    torch.set_num_threads(args.threads)
    engine = LLMEngine.from_config(EngineConfig.from_kwargs(model=smollm2_gguf(), max_model_len=1024,
                                                            dtype=args.dtype))
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 49052) for _ in range(args.input_len)] for _ in range(args.requests)]
    drive(engine, prompts[:2], 2, 4)            # warm-up: first oneDNN calls, first-touch of the KV pool
    tokens, wall, cpu, decode_ms, prefill = drive(engine, prompts, args.concurrency, args.output_len)
    decode_ms.sort()
    weight_bytes = linear_weight_bytes(engine.runner.model)
    p50 = decode_ms[len(decode_ms) // 2] if decode_ms else float("nan")
    print(f"{args.requests} requests x {args.input_len} in / {args.output_len} out, {args.concurrency} in flight, "
          f"dtype {args.dtype}, {args.threads} thread(s); load average {os.getloadavg()[0]:.1f}")
    print(f"output tok/s {tokens / wall:.1f} ({tokens} tokens in {wall:.2f} s wall, {cpu:.2f} s CPU)")
    print(f"decode-only steps: {len(decode_ms)}, p50 {p50:.1f} ms, {sum(decode_ms) / 1000:.2f} s in all"
          f"; each reads the linears' {weight_bytes / 2**20:.0f} MiB of weights: {weight_bytes / p50 / 1e6:.1f} GB/s "
          "at p50, the rest of the step is attention and per-layer ops")
    print(f"steps that prefill: {len(prefill)}, {sum(p[1] for p in prefill) / 1000:.2f} s in all; "
          f"(new tokens, ms, minor faults): {[(n, round(ms), f) for n, ms, f in prefill]}")
