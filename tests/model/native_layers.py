"""Tiny models whose linears take each weight form the native CPU decode layer reads, and decode steps over
shuffled KV blocks: what tests/model/test_cpu_decode_layer.py and test_cpu_decode_stack.py run."""
from __future__ import annotations

import torch

from gh200rt.backends.cpu.amx_weight import AmxWeight, Bf16DotWeight, gated_rows
from gh200rt.backends.cpu.native import load_native_ops
from gh200rt.backends.cpu.ops import use_native_cpu_kernels
from gh200rt.backends.cpu.prepack import NativeRowsWeight, OneDNNWeight, OneRowBlocksWeight
from gh200rt.formats.pack import HalfWeight, pack_weight
from gh200rt.models.arch_config import ArchConfig
from gh200rt.models.base import AttentionMetadata
from gh200rt.models.registry import build_model

OPS = load_native_ops()
BLOCK = 4


def arch(name: str = "llama", layers: int = 2) -> ArchConfig:
    return ArchConfig(architecture=name, vocab_size=64, hidden_size=64, intermediate_size=96, num_layers=layers,
                      num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5,
                      rope_theta=10000.0, tie_word_embeddings=True, attention_bias=name == "qwen2")


def model_with(form: str, name: str = "llama", dtype=torch.float32, layers: int = 2):
    gen = torch.Generator().manual_seed(3)
    model = build_model(arch(name, layers), dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        for i in range(len(model.layers)):
            for ref_name, ref in model.layer_weight_refs(i).items():
                ref.current.copy_(torch.randn(ref.shape, generator=gen) * 0.2)
                weight = ref.current
                gated = gated_rows(weight) if ref_name.endswith("gate_up_proj") else 0
                tiled = Bf16DotWeight if form.startswith("bf16-dot") else AmxWeight
                if form == "native-rows":
                    ref.current = NativeRowsWeight(weight, OneDNNWeight(weight), OPS)
                elif form in ("int8", "int4"):
                    ref.current = pack_weight(weight, form)
                elif form == "one-row-blocks":
                    ref.current = OneRowBlocksWeight(pack_weight(weight, "int4"), HalfWeight(weight.half()))
                elif form == "bf16-one-row-blocks":     # the bf16 route of a GGUF checkpoint
                    ref.current = OneRowBlocksWeight(pack_weight(weight.float(), "int4"), OneDNNWeight(weight))
                elif form in ("bf16-amx", "bf16-dot"):            # the bf16 route's tiles, gate/up packed gated
                    ref.current = tiled(weight, OPS, gated)
                elif form in ("bf16-amx-one-row-blocks", "bf16-dot-one-row-blocks"):   # a GGUF checkpoint there
                    ref.current = OneRowBlocksWeight(pack_weight(weight.float(), "int4"), tiled(weight, OPS, gated))
                elif form == "fp16":
                    ref.current = HalfWeight(weight.half())
    assert use_native_cpu_kernels(model) is None
    return model


def decode_step(rows: int, gen: torch.Generator, pool_blocks: int = 200):
    """A decode step of ``rows`` sequences of different lengths over shuffled blocks of a pool of ``pool_blocks``,
    with K/V already cached."""
    lens = [5 + 7 * r % 240 for r in range(rows)]      # positions within the tiny models' 256
    order = torch.randperm(pool_blocks, generator=gen).tolist()
    tables, used = [], 0
    for n in lens:
        blocks = -(-n // BLOCK)
        tables.append(order[used:used + blocks])
        used += blocks
    meta = AttentionMetadata.build([1] * rows, lens, tables, BLOCK)
    return meta
