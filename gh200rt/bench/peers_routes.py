"""``peers --routes``: single-stream greedy decode of SmolLM2-135M on the CPU, every gh200rt route next to
transformers, measured in one run, with llama.cpp's figure quoted alongside.

    python -m gh200rt.bench peers --routes [fp32 fp16 ...] [--tokens 48] [--rounds 3] [--threads N]

Routes (each an ``LLM`` over the shipped Q4_1 GGUF, activations in float32 unless named):
  fp32          all weights resident in fp32: the default (linears through oneDNN, resident weights reordered)
  fp32-flinear  dense weights with the oneDNN route switched off (F.linear / MKL)
  fp16          --offload direct --host-weight-dtype fp16: decoder layers in fp16 host slabs (fbgemm)
  int8, int4    --offload direct --host-weight-dtype int8 / int4 (torch's exact weight-only ops)
  auto          --dtype auto: the CPU's default route (bf16 through oneDNN with AVX-512 BF16 / AMX)
  int8-bf16, int4-bf16   --dtype bfloat16 --offload direct --host-weight-dtype int8 / int4
The embedding / lm_head (tied, 28 M weights) stays fp32 in every route.

One request per ``generate``; decode rate = (N - 1) / (time for N tokens - time for 1 token), so
prefill is excluded as it is for transformers, which decodes the same chat prompt with its KV
cache in a loop. Routes are interleaved over --rounds rounds (the machine is shared) and the best
round is reported with every round's figure. llama.cpp's ~89 tok/s on this machine (issue 2) is
quoted, not measured here.
"""
from __future__ import annotations

import os
import time

import torch

from gh200rt.bench.rounds import alternate
from gh200rt.models.layers import dense

PROMPT = [{"role": "user", "content": "Explain in detail why the sky is blue."}]
LLAMA_CPP_TOK_S = 89.0
ROUTES = {
    "fp32": {},
    "fp32-flinear": {},
    "fp16": dict(offload="direct", host_weight_dtype="fp16"),
    "int8": dict(offload="direct", host_weight_dtype="int8"),
    "int4": dict(offload="direct", host_weight_dtype="int4"),
    "auto": dict(dtype="auto"),
    "int8-bf16": dict(dtype="bfloat16", offload="direct", host_weight_dtype="int8"),
    "int4-bf16": dict(dtype="bfloat16", offload="direct", host_weight_dtype="int4"),
}


def gh200rt_decode(llm, ids: list[int], tokens: int, onednn: bool) -> tuple[list[int], float]:
    from gh200rt import SamplingParams
    dense._onednn_ok = None if onednn else False  # None: probe at first use, as a fresh process does
    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    many = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    start = time.perf_counter()
    llm.generate([ids], one)
    first = time.perf_counter() - start
    start = time.perf_counter()
    out = llm.generate([ids], many)[0].token_ids
    return out, (tokens - 1) / (time.perf_counter() - start - first)


@torch.inference_mode()
def transformers_decode(model, ids: list[int], tokens: int) -> tuple[list[int], float]:
    result = model(torch.tensor([ids]), use_cache=True)
    out = [int(result.logits[0, -1].argmax())]
    start = time.perf_counter()
    for _ in range(tokens - 1):
        result = model(torch.tensor([out[-1:]]), past_key_values=result.past_key_values, use_cache=True)
        out.append(int(result.logits[0, -1].argmax()))
    return out, (tokens - 1) / (time.perf_counter() - start)


def load_transformers():
    from transformers import AutoModelForCausalLM

    from gh200rt.loader.resolve import resolve_model_path
    path = resolve_model_path("smollm2-135m")
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                 dtype=torch.float32).eval()
    return model, time.perf_counter() - start


def run_routes(args) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    from gh200rt import LLM
    print(f"torch threads {torch.get_num_threads()}, {args.tokens} greedy tokens, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} at start")

    llms, ids = {}, None
    for name in args.routes:
        start = time.perf_counter()
        dense._onednn_ok = False if name == "fp32-flinear" else None  # off at load too: no reordered weights
        llms[name] = LLM(max_model_len=1024, num_kv_blocks=64, **{"dtype": "float32", **ROUTES[name]})
        print(f"gh200rt {name:<13} load {time.perf_counter() - start:6.2f} s")
        ids = ids or llms[name].tokenizer.encode(llms[name].tokenizer.apply_chat_template(PROMPT))
    reference, hf_load = load_transformers()
    print(f"transformers          load {hf_load:6.2f} s")

    for name, llm in llms.items():  # warm-up: first use builds any cached CPU layouts
        gh200rt_decode(llm, ids, 4, name != "fp32-flinear")
    transformers_decode(reference, ids, 4)
    candidates = {name: (lambda _round, name=name, llm=llm: gh200rt_decode(llm, ids, args.tokens,
                                                                           name != "fp32-flinear"))
                  for name, llm in llms.items()}
    candidates["transformers"] = lambda _round: transformers_decode(reference, ids, args.tokens)
    runs = alternate(candidates, args.rounds)
    tokens = {name: done[-1][0] for name, done in runs.items()}
    rates = {name: [rate for _, rate in done] for name, done in runs.items()}

    hf = max(rates["transformers"])
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at end")
    print(f"{'route':<14} {'tok/s':>6}  {'vs transformers':>15}  {'vs llama.cpp 89':>15}  same tokens as "
          f"transformers  rounds")
    for name, values in rates.items():
        best = max(values)
        same = sum(a == b for a, b in zip(tokens[name], tokens["transformers"]))
        print(f"{name:<14} {best:6.1f}  {best / hf:14.2f}x  {best / LLAMA_CPP_TOK_S:14.2f}x  "
              f"{same:>3}/{args.tokens}{'':>17}{', '.join(f'{v:.1f}' for v in values)}")
    if "fp32" in rates:
        print(f"goal (issue 2): >= 2x transformers with the default fp32 route: "
              f"{'met' if max(rates['fp32']) >= 2 * hf else 'not met'} ({max(rates['fp32']) / hf:.2f}x)")
