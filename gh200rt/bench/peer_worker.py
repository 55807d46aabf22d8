"""One engine's share of ``python -m gh200rt.bench peers``, run in a process of its own (and, for the peers, with
the Python of the environment they are installed in, which has no gh200rt).

    python -m gh200rt.bench.peer_worker gh200rt:ROUTE SPEC.json OUT.json      # gh200rt's own interpreter
    PEER_PYTHON gh200rt/bench/peer_worker.py ENGINE SPEC.json OUT.json        # a peer's, by path
    PEER_PYTHON gh200rt/bench/peer_worker.py --write-hf GGUF DIR

Run by path under the peers' interpreter, this file imports nothing but the standard library at its top (an
engine's own package is imported by its class), and nothing of gh200rt but inside ``Gh200rt``.

ENGINE is ``gh200rt:<route>[+batch-invariant]`` (``auto``, ``fp32``, ``int8``), ``vllm:<dtype>`` (``float32``, ``bfloat16``),
``llamacpp`` or ``transformers``. SPEC.json holds the model paths, the token-id prompts, the thread count and
which rows to run; OUT.json receives ``{"single": tok/s, "offline": tok/s, "load_s": s, "sample": [ids]}``.
Every engine decodes greedily with EOS ignored, so each produces exactly the tokens asked for.

single-stream decode: one prompt, (N - 1) / (time(N tokens) - fastest time(1 token)), best of the rounds.
offline: all prompts submitted at once (each round its own prompts, so no round hits a prefix cache) (llama.cpp has
no batch API in its Python binding: one after another; transformers: one left-padded static batch), output tokens /
wall time, best of the rounds.
"""
from __future__ import annotations

import json
import os
import sys
import time


class Gh200rt:
    ROUTES = {"auto": {}, "fp32": dict(dtype="float32"), "bf16": dict(cpu_route="bf16"),
              "fp16": dict(cpu_route="fp16"), "int8": dict(offload="direct", host_weight_dtype="int8")}

    def __init__(self, spec, route):
        from gh200rt import LLM
        route, _, mode = route.partition("+")
        self.llm = LLM(model=spec["gguf"], max_model_len=spec["max_model_len"], num_kv_blocks=spec["kv_blocks"],
                       batch_invariant=mode == "batch-invariant", **self.ROUTES[route])

    def generate(self, prompts, max_tokens):
        from gh200rt import SamplingParams
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        return [list(o.token_ids) for o in self.llm.generate(prompts, params)]


class Vllm:
    def __init__(self, spec, dtype):
        from vllm import LLM
        self.llm = LLM(model=spec["hf_dir"], dtype=dtype, max_model_len=spec["max_model_len"], seed=0)

    def generate(self, prompts, max_tokens):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]


class LlamaCpp:
    def __init__(self, spec, variant):
        """``variant`` ``no-repack``: llama.cpp's weights stay in the file's layout (``use_extra_bufts`` off: no
        AMX or CPU repacking; its AMX buffers crash decoding on some Sapphire Rapids VMs)."""
        import llama_cpp
        import llama_cpp.llama as llama_module
        from llama_cpp import Llama
        if variant == "no-repack":
            default = llama_cpp.llama_model_default_params

            def without_repack():
                params = default()
                params.use_extra_bufts = False
                return params
            llama_module.llama_cpp.llama_model_default_params = without_repack
        elif variant:
            raise SystemExit(f"llamacpp: unknown variant {variant!r} (no-repack)")
        self.llm = Llama(model_path=spec["gguf"], n_ctx=spec["max_model_len"], n_threads=spec["threads"],
                         n_threads_batch=spec["threads"], n_batch=512, verbose=False, seed=0)

    def generate(self, prompts, max_tokens):
        outs = []
        for p in prompts:
            self.llm.reset()
            tokens = []
            for tok in self.llm.generate(p, temp=0.0, top_k=1, reset=True):
                tokens.append(int(tok))
                if len(tokens) == max_tokens:  # EOS ignored: generate() stops only when we do
                    break
            outs.append(tokens)
        return outs


class Transformers:
    def __init__(self, spec, _):
        import torch
        from transformers import AutoModelForCausalLM
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(spec["hf_dir"], dtype=torch.float32).eval()

    def generate(self, prompts, max_tokens):
        width = max(len(p) for p in prompts)
        ids = self.torch.tensor([[0] * (width - len(p)) + p for p in prompts])
        mask = self.torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with self.torch.inference_mode():
            out = self.model.generate(ids, attention_mask=mask, max_new_tokens=max_tokens,
                                      min_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
        return [row.tolist() for row in out[:, width:]]


ENGINES = {"gh200rt": Gh200rt, "vllm": Vllm, "llamacpp": LlamaCpp, "transformers": Transformers}


def single_stream(engine, prompt, tokens: int) -> float:
    # the fastest of three 1-token runs: one disturbed by another process would inflate the rate
    first = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        engine.generate([prompt], 1)
        first = min(first, time.perf_counter() - start)
    start = time.perf_counter()
    out = engine.generate([prompt], tokens)[0]
    assert len(out) == tokens, (len(out), tokens)
    return (tokens - 1) / (time.perf_counter() - start - first)


def offline(engine, prompts, tokens: int) -> float:
    start = time.perf_counter()
    outs = engine.generate(prompts, tokens)
    return sum(len(o) for o in outs) / (time.perf_counter() - start)


def write_hf_dir(gguf: str, out: str) -> None:
    """The GGUF dequantized to a Hugging Face directory (fp32 safetensors + tokenizer), for vLLM and transformers."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    folder, name = os.path.split(gguf)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = model.config
    if hasattr(config, "quantization_config"):  # a GGUF-quantized model refuses to save; a plain copy does not
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    plain.save_pretrained(out)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out)


def main() -> None:
    if sys.argv[1] == "--write-hf":
        write_hf_dir(sys.argv[2], sys.argv[3])
        return
    name, spec_path, out_path = sys.argv[1:4]
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    import torch
    torch.set_num_threads(spec["threads"])
    kind, _, variant = name.partition(":")
    start = time.perf_counter()
    engine = ENGINES[kind](spec, variant)
    result = {"load_s": time.perf_counter() - start}
    engine.generate(spec["warmup_prompts"], 4)  # warm-up (vLLM's compile, oneDNN's first calls)
    if "single" in spec["rows"]:
        result["single"] = max(single_stream(engine, spec["single_prompt"], spec["single_tokens"])
                               for _ in range(spec["rounds"]))
    if "offline" in spec["rows"]:
        rates = [offline(engine, prompts, spec["offline_tokens"]) for prompts in spec["round_prompts"]]
        result["offline"], result["offline_rounds"] = max(rates), rates
    result["sample"] = engine.generate(spec["prompts"][:4], 16)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
