"""Latent attention's decode on the CPU, per layer call: the absorbed form gh200rt runs against the expanded form,
in the same run (calls alternated).

    python -m gh200rt.bench kernel mla-attention [--heads 128] [--dtype bfloat16] [--reps 10] [--threads N]

DeepSeek-V3's attention shape (``kv_lora_rank`` 512, 64 rotary and 128 other query/key dimensions per head, values
of 128; ``--heads`` 128 as V3, 16 for a TP-16 rank's share), blocks of 16, one decoding query per sequence. Timed:
the attention alone, from the step's queries (``q_nope``, ``q_pe``) to the heads' values, the projections before and
after excluded (both forms share them):

- **absorbed** (``LatentAttention.attend``): the queries into latent space through ``W_UK``, one multi-query
  attention over the pool's 576-value latent rows (the native CPU kernels, as the model calls them), ``W_UV`` after;
- **expanded, recomputed**: every context token's per-head keys and values from its latent row through ``kv_b_proj``
  at every step (what transformers does), then SDPA;
- **expanded, cached**: per-head keys and values kept for every token (a conventional MHA cache), then SDPA; its
  cache holds ``heads x (192 + 128)`` values a token against the latent's 576.

Prints each form's median ms per call, the KV bytes each reads per context token, and whether the outputs agree.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from gh200rt.bench.rounds import alternate
from gh200rt.models.arch_config import ArchConfig
from gh200rt.models.base import AttentionMetadata
from gh200rt.models.layers.mla import LatentAttention

BLOCK = 16
CASES = [(1, 512), (1, 2048), (1, 4096), (8, 1024), (8, 4096)]   # (sequences, context tokens)


def v3_attention(heads: int, dtype: torch.dtype) -> LatentAttention:
    arch = ArchConfig(architecture="deepseek_v3", hidden_size=7168, intermediate_size=18432, num_layers=1,
                      num_heads=heads, num_kv_heads=heads, head_dim=64, vocab_size=129280, num_experts=256,
                      num_experts_per_tok=8, moe_intermediate_size=2048, scoring_func="sigmoid", n_group=8,
                      topk_group=4, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, v_head_dim=128)
    attn = LatentAttention(arch, dtype)
    g = torch.Generator().manual_seed(0)
    attn.kv_b_proj.weight_ref.current.copy_(torch.randn(attn.kv_b_proj.weight_ref.shape, generator=g) * 0.05)
    return attn


def expanded(attn: LatentAttention, q_nope, q_pe, latents: list[torch.Tensor], cached: list | None) -> torch.Tensor:
    """Each sequence's values by SDPA over per-head K and V: ``cached[b]`` holds them, else they are computed from
    ``latents[b]`` [S, 576] now."""
    outs = []
    for b, rows in enumerate(latents):
        if cached is not None:
            k, v = cached[b]
        else:
            k, v = expand_kv(attn, rows)
        q = torch.cat((q_nope[b], q_pe[b]), dim=-1)                     # [H, 192]
        out = F.scaled_dot_product_attention(q[:, None], k.transpose(0, 1), v.transpose(0, 1), scale=attn.scale)
        outs.append(out[:, 0])
    return torch.stack(outs)


def expand_kv(attn: LatentAttention, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    kv = F.linear(rows[:, :attn.rank], attn.kv_b_proj.weight_ref.current).view(rows.shape[0], attn.num_heads, -1)
    k = torch.cat((kv[..., :attn.nope_dim], rows[:, None, attn.rank:].expand(-1, attn.num_heads, -1)), dim=-1)
    return k, kv[..., attn.nope_dim:]


def run_case(attn: LatentAttention, seqs: int, context: int, reps: int, dtype: torch.dtype) -> dict:
    g = torch.Generator().manual_seed(seqs * 7 + context)
    blocks = -(-context // BLOCK)
    pool = torch.zeros(1, seqs * blocks + 1, BLOCK, 1, attn.rank + attn.rope_dim, dtype=dtype)
    latents = [torch.randn(context, attn.rank + attn.rope_dim, generator=g).to(dtype) for _ in range(seqs)]
    tables = [list(range(1 + b * blocks, 1 + (b + 1) * blocks)) for b in range(seqs)]
    flat = pool[0].view(-1, attn.rank + attn.rope_dim)
    for b, rows in enumerate(latents):
        slots = torch.tensor([tables[b][p // BLOCK] * BLOCK + p % BLOCK for p in range(context)])
        flat[slots] = rows
    q_nope = torch.randn(seqs, attn.num_heads, attn.nope_dim, generator=g).to(dtype)
    q_pe = torch.randn(seqs, attn.num_heads, attn.rope_dim, generator=g).to(dtype)
    cached = [expand_kv(attn, rows) for rows in latents]

    def absorbed(_round):
        meta = AttentionMetadata.build([1] * seqs, [context] * seqs, tables, BLOCK)
        start = time.perf_counter()
        out = attn.attend(q_nope, q_pe, pool, meta)
        return time.perf_counter() - start, out

    def form(cache):
        def measure(_round):
            start = time.perf_counter()
            out = expanded(attn, q_nope, q_pe, latents, cache)
            return time.perf_counter() - start, out
        return measure
    runs = alternate({"absorbed": absorbed, "expanded, recomputed": form(None), "expanded, cached": form(cached)},
                     reps)
    median = {name: sorted(t for t, _ in r)[len(r) // 2] for name, r in runs.items()}
    want = runs["expanded, cached"][-1][1].float()
    err = float((runs["absorbed"][-1][1].float() - want).abs().max() / want.abs().max())
    return dict(median=median, error=err)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--heads", type=int, default=128, help="query heads (128: DeepSeek-V3's)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--reps", type=int, default=10, help="calls of each form per case (median printed)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")


def run(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    from gh200rt.backends.cpu.ops import use_native_cpu_kernels
    dtype = getattr(torch, args.dtype)
    attn = v3_attention(args.heads, dtype)
    why = use_native_cpu_kernels(attn)
    kernels = "native CPU kernels" if why is None else f"torch ops ({why})"
    elem = torch.empty((), dtype=dtype).element_size()
    latent_bytes, mha_bytes = 576 * elem, args.heads * (192 + 128) * elem
    print(f"latent attention decode, {args.heads} heads, {args.dtype}, {torch.get_num_threads()} threads, absorbed "
          f"form on the {kernels}; KV read per context token and layer: latent {latent_bytes} B, per-head K/V "
          f"{mha_bytes} B ({mha_bytes / latent_bytes:.0f}x)")
    print(f"{'case':<28}{'absorbed ms':>12}{'recomputed ms':>15}{'cached ms':>11}{'vs recomputed':>15}"
          f"{'vs cached':>11}{'max rel err':>13}")
    with torch.inference_mode():
        for seqs, context in CASES:
            r = run_case(attn, seqs, context, args.reps, dtype)
            m = r["median"]
            a, rec, cac = m["absorbed"], m["expanded, recomputed"], m["expanded, cached"]
            print(f"{f'{seqs} x {context} tokens':<28}{a * 1e3:>12.3f}{rec * 1e3:>15.3f}{cac * 1e3:>11.3f}"
                  f"{rec / a:>14.2f}x{cac / a:>10.2f}x{r['error']:>13.2g}")
    return 0

