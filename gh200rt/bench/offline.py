"""The offline half of ``throughput``: gh200rt's ``LLM.generate`` per route against transformers one request at a
time and as one static batch, same requests, same run, rounds interleaved; and the scheduler's input preparation per
step with 256 running decode requests. What each figure is and its goal: ``throughput.py``'s docstring (the
subcommand's ``--help``).
"""
from __future__ import annotations

import os
import random
import time

import torch

from gh200rt.bench.models import smollm2_gguf
from gh200rt.bench.rounds import alternate

GOAL_SCHED_MS = 2.0


def make_prompts(tokenizer, count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    topics = ["the ocean", "a robot", "mountains", "coffee", "a library", "the moon", "trains", "music"]
    prompts = []
    for i in range(count):
        text = f"Write a short story about {rng.choice(topics)} and {rng.choice(topics)}, number {i}." \
               + " Make it vivid." * rng.randrange(0, 6)
        prompts.append(list(tokenizer.encode(text)))
    return prompts


ROUTES = {"fp32": {}, "fp32-flinear": {}, "fp16": dict(offload="direct", host_weight_dtype="fp16"),
          "auto": dict(dtype="auto"), "int8-bf16": dict(dtype="bfloat16", offload="direct", host_weight_dtype="int8")}


def load_gh200rt(route: str, prompts, max_tokens: int):
    from gh200rt import LLM
    from gh200rt.models.layers import dense
    dense._onednn_ok = False if route == "fp32-flinear" else None  # off at load too: no reordered weights
    llm = LLM(model=smollm2_gguf(), num_kv_blocks=1024, **{"dtype": "float32", **ROUTES[route]})
    bench_gh200rt(llm, route, prompts[:2], max_tokens)  # warm-up
    return llm


def bench_gh200rt(llm, route: str, prompts, max_tokens: int) -> tuple[float, int]:
    from gh200rt import SamplingParams
    from gh200rt.models.layers import dense
    dense._onednn_ok = False if route == "fp32-flinear" else None  # None: probe, as a fresh process does
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    dt = time.perf_counter() - t0
    return sum(len(o.token_ids) for o in outs) / dt, sum(len(o.token_ids) for o in outs)


def load_hf():
    from transformers import AutoModelForCausalLM
    path = smollm2_gguf()
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                 dtype=torch.float32)
    return model.eval()


@torch.inference_mode()
def bench_hf_sequential(model, prompts, max_tokens: int) -> float:
    tokens, t0 = 0, time.perf_counter()
    for p in prompts:
        ids = torch.tensor([p])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                             min_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
        tokens += out.shape[1] - ids.shape[1]
    return tokens / (time.perf_counter() - t0)


@torch.inference_mode()
def bench_hf_static_batch(model, prompts, max_tokens: int) -> float:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    t0 = time.perf_counter()
    out = model.generate(ids, attention_mask=mask, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                         do_sample=False, pad_token_id=0)
    return (out.shape[1] - width) * len(prompts) / (time.perf_counter() - t0)


def bench_scheduler_step(num_requests: int = 256, steps: int = 200) -> float:
    """ms per step of schedule() + prepare_inputs() + step_done() with num_requests decoding."""
    from gh200rt.engine.model_runner import prepare_inputs
    from gh200rt.kv.kv_manager import KVCacheManager
    from gh200rt.sampling_params import SamplingParams
    from gh200rt.scheduler.request import Sequence
    from gh200rt.scheduler.scheduler import Scheduler
    kv = KVCacheManager(num_requests * 40, 16)
    sched = Scheduler(kv, max_num_seqs=num_requests, max_num_batched_tokens=2048)
    rng = random.Random(0)
    params = SamplingParams(temperature=0, max_tokens=10_000)
    for i in range(num_requests):
        sched.add(Sequence(str(i), str(i), 0, [rng.randrange(1, 30000) for _ in range(rng.randrange(50, 300))],
                           params, i))
    while sched.waiting or any(s.num_computed_tokens < s.num_tokens - 1 for s in sched.running):
        out = sched.schedule()
        sched.step_done(out)
        for item in out.scheduled:
            if item.seq.num_computed_tokens == item.seq.num_tokens:
                item.seq.append_token(1)
    t0 = time.perf_counter()
    for _ in range(steps):
        out = sched.schedule()
        assert len(out.scheduled) == num_requests
        prepare_inputs(out, 16)
        sched.step_done(out)
        for item in out.scheduled:
            item.seq.append_token(1)
    return (time.perf_counter() - t0) / steps * 1000


def bench_sampler_step(kind: str, rows: int = 64, vocab: int = 49152, steps: int = 30) -> float:
    """ms per Sampler call on ``rows`` x ``vocab`` float32 logits: ``greedy`` rows, or ``mixed`` rows
    (temperature, top-k / top-p / min-p, penalties, half of them seeded, logprobs on a quarter)."""
    from gh200rt.engine.sampler import Sampler
    from gh200rt.sampling_params import SamplingParams
    from gh200rt.scheduler.request import Sequence
    rng = random.Random(0)
    seqs = []
    for i in range(rows):
        if kind == "greedy":
            params = SamplingParams(temperature=0)
        else:
            params = SamplingParams(temperature=0.8, top_k=50 if i % 2 else 0, top_p=0.9, min_p=0.02,
                                    repetition_penalty=1.1, frequency_penalty=0.2, seed=i if i % 2 else None,
                                    logprobs=5 if i % 4 == 0 else None)
        seq = Sequence(str(i), str(i), 0, [rng.randrange(vocab) for _ in range(200)], params, i)
        for _ in range(50):
            seq.append_token(rng.randrange(vocab))
        seqs.append(seq)
    # N(0, 4^2) logits: peaked like a language model's (top-p 0.9 lies in the few largest hundred)
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)) * 4
    sampler = Sampler(0)
    sampler(logits, seqs)
    t0 = time.perf_counter()
    for _ in range(steps):
        sampler(logits, seqs)
    return (time.perf_counter() - t0) / steps * 1000


def run_offline(args) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    ms = bench_scheduler_step()
    print(f"scheduler + input preparation, 256 running decodes: {ms:.3f} ms/step (goal <= {GOAL_SCHED_MS} ms)")
    for kind in ("greedy", "mixed"):
        print(f"sampler, 64 {kind} rows x 49152 vocab: {bench_sampler_step(kind):.2f} ms/step")
    if args.skip_model:
        return
    from gh200rt.config import ModelConfig
    from gh200rt.loader import load_model
    tokenizer = load_model(ModelConfig(model=smollm2_gguf())).tokenizer
    prompts = make_prompts(tokenizer, args.requests)
    print(f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f} at start")
    llms = {route: load_gh200rt(route, prompts, args.max_tokens) for route in args.routes}
    model = load_hf()
    candidates = {route: (lambda _round, route=route, llm=llm: bench_gh200rt(llm, route, prompts, args.max_tokens)[0])
                  for route, llm in llms.items()}
    candidates["static"] = lambda _round: bench_hf_static_batch(model, prompts, args.max_tokens)
    rates = alternate(candidates, args.rounds)
    seq = bench_hf_sequential(model, prompts[:args.hf_sequential], args.max_tokens)
    print(f"load average {os.getloadavg()[0]:.1f} at end")
    static = max(rates["static"])
    print(f"transformers one at a time ({args.hf_sequential} requests): {seq:.1f} tokens/s")
    print(f"transformers static padded batch ({args.requests} requests): {static:.1f} tokens/s "
          f"(rounds: {', '.join(f'{r:.1f}' for r in rates['static'])})")
    for route in args.routes:
        ours = max(rates[route])
        print(f"gh200rt LLM.generate [{route}], {args.requests} requests x {args.max_tokens} tokens: {ours:.1f} "
              f"tokens/s (rounds: {', '.join(f'{r:.1f}' for r in rates[route])})")
        print(f"  ratio vs one at a time: {ours / seq:.2f}x (floor 5x) {'OK' if ours / seq >= 5 else 'BELOW FLOOR'}")
        print(f"  ratio vs static batch:  {ours / static:.2f}x (goal 1.5x) "
              f"{'OK' if ours / static >= 1.5 else 'below goal'}")
