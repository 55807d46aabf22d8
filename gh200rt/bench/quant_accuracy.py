"""``accuracy --formats``: perplexity and logit error of SmolLM2 with each host weight format and KV cache dtype
against the unquantized model (also the library tests/kernels/test_quant_model.py scores with)."""
from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from gh200rt.formats.pack import pack_weight, quantize_int4, quantize_int8

EVAL_TEXT = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "eval_text.txt"   # in a checkout
BLOCK_SIZE = 16
FORMATS = {"fp16": lambda w: pack_weight(w, "fp16"), "int8": lambda w: quantize_int8(w),
           "int4": lambda w: quantize_int4(w, 32),
           "int4-g128": lambda w: quantize_int4(w, 128),
           "int8-fbgemm": lambda w: quantize_int8(w, cpu_route="fbgemm"),
           "fp8": lambda w: pack_weight(w, "fp8")}
# name -> (weight format or None, KV cache dtype, scales set from the scored text)
VARIANTS = {**{name: (name, None, False) for name in FORMATS},
            "fp8-kv": (None, "fp8", False), "fp8-kv-calc": (None, "fp8", True),
            "fp8_e5m2-kv": (None, "fp8_e5m2", False), "fp8+fp8-kv": ("fp8", "fp8", False),
            "fp8+fp8-kv-calc": ("fp8", "fp8", True)}


def load_reference():
    """gh200rt's LoadedModel of the default model (SmolLM2 from its GGUF), float32 on the CPU."""
    from gh200rt.config import ModelConfig
    from gh200rt.loader import load_model
    return load_model(ModelConfig(dtype="float32"))


def weight_refs(model) -> list:
    return [ref for i in range(len(model.layers)) for ref in model.layer_weight_refs(i).values()]


def swap_in_packed(model, quantize) -> tuple[list, int, int]:
    """Repoint every decoder linear to its packed form; returns (originals, bf16 bytes, packed bytes)."""
    originals, dense_bytes, packed_bytes = [], 0, 0
    for ref in weight_refs(model):
        dense = ref.current
        originals.append((ref, dense))
        ref.current = quantize(dense)
        dense_bytes += dense.numel() * 2  # as bf16, the host format it replaces
        packed_bytes += ref.current.nbytes
    return originals, dense_bytes, packed_bytes


def restore(originals: list) -> None:
    for ref, dense in originals:
        ref.current = dense


@torch.inference_mode()
def score(loaded, ids: torch.Tensor, kv_cache_dtype: str = "auto", calculate_kv_scales: bool = False
          ) -> tuple[torch.Tensor, float]:
    """(logits [T, V], perplexity of tokens 1..T-1), one prefill over a fresh paged KV pool of
    ``kv_cache_dtype`` (a --kv-cache-dtype value)."""
    from gh200rt.kv.fp8 import kv_cache_dtype as pool_dtype
    from gh200rt.models.base import AttentionMetadata
    from gh200rt.models.layers.attention import SelfAttention, configure_kv_scales
    arch, t = loaded.arch, len(ids)
    blocks = -(-t // BLOCK_SIZE)
    meta = AttentionMetadata.build([t], [t], [list(range(blocks))], BLOCK_SIZE)
    pools = [torch.zeros(2, blocks, BLOCK_SIZE, arch.num_kv_heads, arch.head_dim,
                         dtype=pool_dtype(kv_cache_dtype, loaded.dtype)) for _ in range(arch.num_layers)]
    for layer in loaded.model.modules():  # every variant starts from the default scales
        if isinstance(layer, SelfAttention):
            layer.kv_scale.fill_(1.0)
    configure_kv_scales(loaded.model, calculate_kv_scales)
    hidden = loaded.model(ids, meta.positions(), meta, pools)
    logits = loaded.model.compute_logits(hidden).float()
    nll = torch.nn.functional.cross_entropy(logits[:-1], ids[1:])
    return logits, math.exp(nll.item())


def text_ids(loaded, text_path: str | Path = EVAL_TEXT, max_tokens: int | None = None) -> torch.Tensor:
    if not Path(text_path).is_file():
        raise SystemExit(f"the eval text {text_path} is not here: run accuracy from a gh200rt checkout")
    with open(text_path, encoding="utf-8") as f:
        return torch.tensor(loaded.tokenizer.encode(f.read())[:max_tokens], dtype=torch.int64)


def evaluate(loaded, ids: torch.Tensor, formats: list[str]) -> list[dict]:
    ref_logits, ref_ppl = score(loaded, ids)
    rows = [dict(format="reference fp32", tokens=len(ids), ppl=ref_ppl, max_logit_err=0.0, mean_logit_err=0.0,
                 top1_agree=1.0, bytes_ratio=1.0)]
    for fmt in formats:
        weights, kv, calculate = VARIANTS[fmt]
        originals, dense_bytes, packed_bytes = swap_in_packed(loaded.model, FORMATS[weights]) if weights else \
            ([], 1, 1)
        try:
            logits, ppl = score(loaded, ids, kv or "auto", calculate)
        finally:
            restore(originals)
        err = (logits - ref_logits).abs()
        rows.append(dict(format=fmt, tokens=len(ids), ppl=ppl, max_logit_err=err.max().item(),
                         mean_logit_err=err.mean().item(),
                         top1_agree=(logits.argmax(-1) == ref_logits.argmax(-1)).float().mean().item(),
                         bytes_ratio=packed_bytes / dense_bytes))
    return rows


def run_formats(args) -> None:
    """The table of ``accuracy --formats``: every variant against the reference, on the whole text (or
    ``--max-tokens``)."""
    if args.native_all_rows:
        from gh200rt.backends.cpu import packed_linear
        packed_linear.NATIVE_MAX_ROWS = 1 << 30
    start = time.time()
    loaded = load_reference()
    rows = evaluate(loaded, text_ids(loaded, max_tokens=args.max_tokens), args.formats)
    print("| format | tokens | perplexity | ppl change | max abs logit err | mean abs logit err | top-1 agreement |"
          " weight bytes vs bf16 |")
    print("|---|---|---|---|---|---|---|---|")
    ref = rows[0]["ppl"]
    for r in rows:
        print(f"| {r['format']} | {r['tokens']} | {r['ppl']:.4f} | {100 * (r['ppl'] / ref - 1):+.2f}% |"
              f" {r['max_logit_err']:.4f} | {r['mean_logit_err']:.4f} | {100 * r['top1_agree']:.1f}% |"
              f" {r['bytes_ratio']:.3f} |")
    print(f"({time.time() - start:.0f} s)")
