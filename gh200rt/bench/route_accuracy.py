"""``accuracy --routes``: every CPU compute route as the engine runs it, scored against the exact float32 route
(also the library tests/model/test_cpu_route_parity.py bounds)."""
from __future__ import annotations

import time

import torch

from gh200rt.backends.cpu.prepack import cpu_route_form
from gh200rt.bench import quant_accuracy
from gh200rt.config import ModelConfig
from gh200rt.formats.pack import quantize_int4, quantize_int8
from gh200rt.loader import load_model

ROUTES = ("bf16", "fp16", "int8-bf16", "int4-bf16", "gguf-rows", "gguf-rows-bf16")
_LINEAR_FORMAT = {"bf16": "onednn-bf16", "fp16": "fp16", "int8-bf16": "onednn-bf16", "int4-bf16": "onednn-bf16"}
_PACKED = {"int8-bf16": lambda w: quantize_int8(w), "int4-bf16": lambda w: quantize_int4(w.float(), 32)}


class _EveryRow:
    """A GGUF-block weight multiplied by the native kernel at every row count (as one row at a time would be)."""

    def __init__(self, packed):
        from gh200rt.backends.cpu.native import load_native_ops
        self.packed, self.ops = packed, load_native_ops()

    def linear(self, x, bias=None):
        y = self.ops.quant_linear(x, self.packed)      # float32, from x widened to float32
        return (y if bias is None else y + bias.float()).to(x.dtype)


def gguf_rows_model(dtype: str = "float32"):
    """The ``dtype`` model with every linear on its GGUF blocks and the native quantized linear."""
    from gh200rt.backends.cpu.prepack import gguf_blocks_form
    from gh200rt.weights.device_moves import gguf_parts, lm_head_parts
    loaded = load_model(ModelConfig(dtype=dtype))
    model = loaded.model
    for i in range(len(model.layers)):
        for name, ref in model.layer_weight_refs(i).items():
            ref.current = _EveryRow(_blocks(gguf_blocks_form(gguf_parts(loaded.quantized, i, name)), name))
    parts = lm_head_parts(loaded.quantized, model.arch.tie_word_embeddings)
    model.lm_head.weight_ref.current = _EveryRow(_blocks(gguf_blocks_form(parts), "lm_head"))
    return loaded


def _blocks(packed, name: str):
    if packed is None:
        raise SystemExit(f"gguf-rows: {name} has no GGUF Q4_0/Q4_1/Q8_0 blocks the native kernel takes "
                         "(or the native library did not build)")
    return packed


def route_model(route: str):
    """The LoadedModel as the engine computes on ``route`` (all layers resident unless packed)."""
    if route in ("gguf-rows", "gguf-rows-bf16"):
        return gguf_rows_model("bfloat16" if route.endswith("bf16") else "float32")
    loaded = load_model(ModelConfig(dtype="float32" if route == "fp16" else "bfloat16"))
    model = loaded.model
    layers = list(range(len(model.layers)))
    if route in _PACKED:  # decoder linears packed (as a direct host slab holds them), lm_head reordered
        for ref in quant_accuracy.weight_refs(model):
            ref.current = _PACKED[route](ref.current.float())
        layers = []
    refs = [ref for i in layers for ref in model.layer_weight_refs(i).values()] + [model.lm_head.weight_ref]
    with torch.inference_mode():
        for ref in refs:
            ref.current = cpu_route_form(ref.current, _LINEAR_FORMAT[route])
    return loaded


def compare(ref_logits: torch.Tensor, ref_ppl: float, logits: torch.Tensor, ppl: float) -> dict:
    err = (logits - ref_logits).abs()
    ref_top, top = ref_logits.argmax(-1), logits.argmax(-1)
    # where the route picks another token, how far behind the reference's choice that token was in fp32
    margins = ref_logits.gather(-1, ref_top[:, None]) - ref_logits.gather(-1, top[:, None])
    return dict(ppl=ppl, ppl_change=ppl / ref_ppl - 1, max_logit_err=err.max().item(),
                mean_logit_err=err.mean().item(), top1_agree=(top == ref_top).float().mean().item(),
                worst_flip_margin=margins.max().item())


def evaluate_routes(routes: list[str], max_tokens: int | None = None) -> tuple[dict, dict[str, dict]]:
    reference = quant_accuracy.load_reference()
    ids = quant_accuracy.text_ids(reference, max_tokens=max_tokens)
    ref_logits, ref_ppl = quant_accuracy.score(reference, ids)
    results = {}
    for route in routes:
        logits, ppl = quant_accuracy.score(route_model(route), ids)
        results[route] = compare(ref_logits, ref_ppl, logits, ppl)
    return dict(ppl=ref_ppl, tokens=len(ids)), results


def run_routes(args) -> None:
    """The table of ``accuracy --routes``."""
    start = time.time()
    ref, results = evaluate_routes(args.routes, args.max_tokens)
    print("| route | tokens | perplexity | ppl change | max abs logit err | mean abs logit err | top-1 agreement |"
          " widest fp32 margin flipped |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| fp32 (reference) | {ref['tokens']} | {ref['ppl']:.4f} | +0.00% | 0 | 0 | 100.0% | - |")
    for route, r in results.items():
        print(f"| {route} | {ref['tokens']} | {r['ppl']:.4f} | {100 * r['ppl_change']:+.2f}% | "
              f"{r['max_logit_err']:.4f} | {r['mean_logit_err']:.4f} | {100 * r['top1_agree']:.1f}% | "
              f"{r['worst_flip_margin']:.3f} |")
    print(f"({time.time() - start:.0f} s, {torch.get_num_threads()} threads)")
