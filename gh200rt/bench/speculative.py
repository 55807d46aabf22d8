"""``speculative``: decoding with and without speculative decoding in the same run, on an input-grounded workload.

Each task gives the model a text it must largely repeat (code to edit, a passage to correct or reformat): the
workload prompt lookup (``ngram``) was made for, as in editing assistants and RAG answers that quote their sources.
The texts are gh200rt's own source files, so the workload ships with the package and needs no download. The same
chat prompts run on an engine without speculation and on one with ``--speculative-config``, greedy, alone one after
another (single stream) and ``--batch`` at a time; tokens/s counts output tokens over wall time, prefill included,
and the single stream's decode tok/s counts the tokens after the first over the time after the first (what
speculation changes: the long inputs' prefill is the same either way).
Reports the speed-up, the acceptance rate (accepted / drafted tokens), the tokens a verifying step emits per
sequence, and whether both engines produced the same tokens (greedy speculation must). ``--offload stream`` streams
every layer's weights into staging slots (on a GPU: the link-bound step speculation is for); ``--json`` writes the
figures for the GPU validation kit.
"""
from __future__ import annotations

import argparse
import importlib.resources
import json
import os
import time

import torch

from gh200rt.bench.models import smollm2_gguf
from gh200rt.bench.random_model import add_random_model_arguments, model_of
from gh200rt.engine.llm import LLM
from gh200rt.sampling_params import SamplingParams

SOURCES = ("speculative/ngram.py", "engine/sampling_tensors.py", "kv/block_row.py", "engine/device_inputs.py",
           "histogram.py", "engine/errors.py", "speculative/__init__.py", "engine/invariance.py")
TASKS = ("Rename every variable called `tokens` to `ids` in this code and show the whole result:\n\n{text}",
         "Fix any typos in the comments of this code and return it in full:\n\n{text}",
         "Add type hints where they are missing and return the complete file:\n\n{text}",
         "Copy this text and put a one-line summary above it:\n\n{text}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="model path or alias (default: SmolLM2-135M-Instruct GGUF)")
    parser.add_argument("--dtype", default="auto")
    add_random_model_arguments(parser)
    parser.add_argument("--speculative-config", default='{"method": "ngram", "num_speculative_tokens": 4, '
                                                        '"prompt_lookup_min": 2, "prompt_lookup_max": 4}',
                        help="the engine flag, as JSON")
    parser.add_argument("--prompts", type=int, default=8, help="tasks, each over one source text")
    parser.add_argument("--max-chars", type=int, default=1200, help="characters of each source text")
    parser.add_argument("--output-tokens", type=int, default=192)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8, help="requests in flight in the batched run")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--offload", default="none", choices=("none", "stream"),
                        help="the target's weights: resident, or every layer streamed (the engine's --offload)")
    parser.add_argument("--random-eagle3-head", action="store_true",
                        help="first write a random EAGLE-3 head for the model into the speculative config's "
                             "\"model\" directory (method eagle3): it accepts almost nothing, so the run measures "
                             "what drafting with a head costs")
    parser.add_argument("--json", default=None, help="also write the figures here")
    parser.add_argument("--order", default="off,on",
                        help="the engines in the order they run: off, on (speculation, with the engine's default "
                             "async scheduling: on on a GPU), on-sync and on-async (speculation with "
                             "--no-async-scheduling / --async-scheduling); e.g. on,off or off,on-sync,on-async")


def task_prompts(count: int, max_chars: int) -> list[list[dict]]:
    package = importlib.resources.files("gh200rt")
    prompts = []
    for i in range(count):
        text = (package / SOURCES[i % len(SOURCES)]).read_text()[:max_chars]
        prompts.append([{"role": "user", "content": TASKS[i % len(TASKS)].format(text=text)}])
    return prompts


def timed(llm: LLM, prompts: list[list[int]], params: SamplingParams, batch: int) -> tuple[float, float, list]:
    """Output tokens/s over ``prompts`` run ``batch`` at a time, decode tokens/s (after each request's first token),
    and the outputs' token ids."""
    outputs, decode_tokens, decode_seconds = [], 0, 0.0
    started = time.perf_counter()
    for i in range(0, len(prompts), batch):
        for o in llm.generate(prompts[i:i + batch], params):
            outputs.append(o.outputs[0].token_ids)
            decode_tokens += len(o.outputs[0].token_ids) - 1
            decode_seconds += o.metrics.last_token_time - o.metrics.first_token_time
    wall = time.perf_counter() - started
    return sum(len(o) for o in outputs) / wall, decode_tokens / decode_seconds, outputs


ENGINES = {"off": "spec off", "on": "spec on", "on-sync": "spec sync", "on-async": "spec async"}


def run_engine(args, name: str, chats) -> dict:
    options = dict(model=args.model or smollm2_gguf(), dtype=args.dtype, max_model_len=args.max_model_len,
                   max_num_seqs=max(args.batch, 1), offload=args.offload)
    if name != "off":
        options["speculative_config"] = json.loads(args.speculative_config)
    if name in ("on-sync", "on-async"):
        options["async_scheduling"] = name == "on-async"
    llm = LLM(**options)
    try:
        # a model without a chat template (a random checkpoint of a real shape) reads the task as plain text
        prompts = [llm.tokenizer.apply_chat_template(c, add_generation_prompt=True) if llm.tokenizer.chat_template
                   else c[-1]["content"] for c in chats]
        params = SamplingParams(temperature=0, max_tokens=args.output_tokens)
        llm.generate([prompts[0][:32]], SamplingParams(temperature=0, max_tokens=4))       # warm-up
        single, decode, outputs = timed(llm, prompts, params, 1)
        batched, _, batched_outputs = timed(llm, prompts, params, args.batch)
        stats = llm.engine.stats().spec_decode
    finally:
        llm.engine.close()
    return dict(label=ENGINES[name], single=single, decode=decode, batched=batched,
                outputs=outputs,
                batched_outputs=batched_outputs, stats=stats, prompt_tokens=sum(map(len, prompts)))


def first_difference(a: list[int], b: list[int]) -> int:
    """The index of the first token where two outputs differ (the shorter's length where one extends the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def write_head_for(model: str, speculative_config: str) -> None:
    """A random EAGLE-3 head of the published format for ``model`` where ``speculative_config`` names it."""
    from gh200rt.bench.random_heads import write_random_eagle3_head
    from gh200rt.loader.load import read_arch
    config = json.loads(speculative_config)
    if config.get("method") != "eagle3" or not config.get("model"):
        raise SystemExit("--random-eagle3-head writes the head the speculative config drafts with: give --speculative"
                         "-config '{\"method\": \"eagle3\", \"model\": DIR, \"num_speculative_tokens\": 3}'")
    a = read_arch(model)
    write_random_eagle3_head(config["model"], hidden=a.hidden_size, heads=a.num_heads, kv_heads=a.num_kv_heads,
                             intermediate=a.intermediate_size, vocab=a.vocab_size,
                             draft_vocab=min(32000, a.vocab_size), weights_dtype=torch.bfloat16,
                             aux_ids=None if a.num_layers >= 4 else [0, a.num_layers // 2, a.num_layers - 1],
                             extra={"rope_theta": a.rope_theta, "rms_norm_eps": a.rms_norm_eps})
    print(f"wrote a random EAGLE-3 head for {model} to {config['model']}")


def run(args) -> int:
    torch.set_num_threads(args.threads)
    chats = task_prompts(args.prompts, args.max_chars)
    results = {}
    with model_of(args) as args.model:
        if args.random_eagle3_head:
            write_head_for(args.model or smollm2_gguf(), args.speculative_config)
        for name in args.order.split(","):
            if name not in ENGINES:
                raise SystemExit(f"--order: {', '.join(ENGINES)}, comma-separated; got {args.order!r}")
            results[name] = run_engine(args, name, chats)
    first = next(iter(results.values()))
    print(f"{args.prompts} input-grounded tasks ({first['prompt_tokens']} prompt tokens), {args.output_tokens} output "
          f"tokens each, greedy; batch {args.batch}; dtype {args.dtype}, weights {args.offload}, {args.threads} "
          f"thread(s), load average {os.getloadavg()[0]:.1f}; speculation: {args.speculative_config}")
    print(f"{'engine':<9} {'single tok/s':>12} {'decode tok/s':>12} {f'batch-{args.batch} tok/s':>14} "
          f"{'acceptance':>10} {'tokens/step':>11}")
    for r in results.values():
        s = r["stats"]
        accept = f"{s.acceptance_rate:10.2f}" if s else f"{'-':>10}"
        length = f"{s.mean_accepted_length:11.2f}" if s else f"{'-':>11}"
        print(f"{r['label']:<9} {r['single']:12.1f} {r['decode']:12.1f} {r['batched']:14.1f} {accept} {length}")
    if "off" in results and "on" in results:
        off, on = results["off"], results["on"]
        pairs = list(zip(off["outputs"] + off["batched_outputs"], on["outputs"] + on["batched_outputs"]))
        same = sum(a == b for a, b in pairs)
        decode = on["decode"] / off["decode"]
        batched = on["batched"] / off["batched"]
        print(f"speed-up: single stream {on['single'] / off['single']:.2f}x (decode {decode:.2f}x), batch {args.batch} "
              f"{batched:.2f}x; greedy outputs {'identical' if same == len(pairs) else 'DIFFER'}"
              + ("" if same == len(pairs) else f" ({same} of {len(pairs)} equal; the others first differ at token "
                 f"{', '.join(str(first_difference(a, b)) for a, b in pairs if a != b)}: without --batch-invariant a "
                 "verifying step's rows may round as a batch does, and a near tie can turn, docs/SPECULATIVE.md)"))
    if "on-sync" in results and "on-async" in results:
        on, sync = results["on-async"], results["on-sync"]
        same = on["outputs"] + on["batched_outputs"] == sync["outputs"] + sync["batched_outputs"]
        print(f"async scheduling with speculation: single stream {on['single'] / sync['single']:.2f}x, batch "
              f"{args.batch} {on['batched'] / sync['batched']:.2f}x of spec sync; outputs "
              f"{'identical' if same else 'DIFFER'}")
    if args.json:
        figures = {name: {"single_tok_s": r["single"], "decode_tok_s": r["decode"], "batched_tok_s": r["batched"],
                          "acceptance": r["stats"].acceptance_rate if r["stats"] else None,
                          "tokens_per_step": r["stats"].mean_accepted_length if r["stats"] else None}
                   for name, r in results.items()}
        extra = {}
        if "off" in results and "on" in results:
            extra["first_differences"] = [first_difference(a, b) if a != b else None for a, b in pairs]
        with open(args.json, "w") as f:
            json.dump({"offload": args.offload, "batch": args.batch, "speculative_config": args.speculative_config,
                       "engines": figures, **extra}, f, indent=1)
    return 0
