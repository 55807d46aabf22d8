"""Accuracy against the exact float32 model on SmolLM2, scored in one prefill over tests/fixtures/eval_text.txt:
perplexity and logit error of every CPU compute route (``--routes``), or of each host weight format and KV cache
dtype (``--formats``). Run it from a checkout (the text is a test fixture).

    python -m gh200rt.bench accuracy --routes [bf16 fp16 int8-bf16 int4-bf16 ...] [--max-tokens N]
    python -m gh200rt.bench accuracy --formats [fp16 int8 int4 int4-g128 int8-fbgemm fp8 fp8-kv ...]
        [--native-all-rows] [--max-tokens N]

``--routes`` (none named: all). Each route is the model as the engine runs it on that route
(``backends/cpu/routes.py``):

  bf16        --dtype auto on a CPU with AVX-512 BF16 / AMX: bf16 weights and activations, linears
              through oneDNN over reordered weights (``cpu_route_form``), bf16 KV cache
  fp16        --dtype auto on an AVX2 CPU without native bf16: fp32 activations, fp16 linear weights (fbgemm)
  int8-bf16   --offload direct --host-weight-dtype int8 on the bf16 route: per-channel int8 decoder
              weights, bf16 activations (torch's weight-only op)
  int4-bf16   the same with int4 groups of 32 (GGUF Q4_1's own grid)
  gguf-rows   the single-row half of --dtype auto's fp16+gguf form on an AVX2 CPU (one sequence decoding):
              every linear multiplies the GGUF file's own Q4_1 / Q8_0 blocks through the native quantized
              linear (``kernels/cpu/quant_linear.c``), fp32 activations rounded to int16 per 32 columns.
              The kernel never mixes rows, so the one prefill scored here gives each token exactly the
              logits a one-row decode of it would
  gguf-rows-bf16  the same on the bf16 route's onednn-bf16+gguf form: bf16 activations widened to fp32 for
              the blocks, each product rounded back to bf16

The reference is ``load_model(dtype="float32")`` over the shipped Q4_1 GGUF; tests/fixtures/eval_text.txt
is scored in one prefill (``quant_accuracy.score``). The lm_head and embedding follow the route's dtype.

``--formats`` (none named: fp16 int8 int4 int4-g128). The reference is gh200rt's own SmolLM2-135M-Instruct
(``load_model`` on the shipped Q4_1 GGUF, computed in float32: the "unquantized" model we can have offline). Every
decoder linear weight (fused qkv, o, fused gate/up, down) is then repointed, through its ``WeightRef``, to a
``HalfWeight`` / ``PackedWeight`` made from the dense float32 tensor, and the fixed text
tests/fixtures/eval_text.txt is scored in one prefill pass over a paged KV pool. The KV variants (``fp8-kv`` ...)
keep the weights and store the pool in fp8: with the layers' scales at 1.0 (what ``--kv-cache-dtype fp8`` does
without scales in the checkpoint) or set from the text itself (the first batch, as ``--calculate-kv-scales`` does);
``fp8+fp8-kv`` quantizes both.
"""
from __future__ import annotations

import argparse

from gh200rt.bench.quant_accuracy import VARIANTS, run_formats
from gh200rt.bench.route_accuracy import ROUTES, run_routes

DEFAULT_FORMATS = ["fp16", "int8", "int4", "int4-g128"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--routes", nargs="*", choices=ROUTES, help="CPU compute routes (none named: all)")
    which.add_argument("--formats", nargs="*", choices=list(VARIANTS),
                       help=f"host weight formats and KV cache dtypes (none named: {' '.join(DEFAULT_FORMATS)})")
    parser.add_argument("--max-tokens", type=int, default=None, help="score the text's first N tokens only")
    parser.add_argument("--native-all-rows", action="store_true",
                        help="--formats: int8 / int4 linears through the native quantized kernel at every row count "
                             "(decode takes it up to kernels.packed_cpu_routes.NATIVE_MAX_ROWS rows; a whole-text "
                             "prefill would not)")


def run(args) -> int:
    if args.routes is not None:
        args.routes = args.routes or list(ROUTES)
        run_routes(args)
    else:
        args.formats = args.formats or DEFAULT_FORMATS
        run_formats(args)
    return 0
