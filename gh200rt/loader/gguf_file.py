"""Weights, architecture and tokenizer metadata of a GGUF file (llama-family architectures).

Tensors are renamed to transformers' names, dequantized to float32 with our numpy dequantizers
and written once into the model; quantized tensors stay reachable as ``QuantizedTensor``. For the
llama architecture llama.cpp's converter permuted the rows of q/k weights (interleaved RoPE
layout); ``unpermute_rows`` restores the rotate-half layout transformers uses.
"""
from __future__ import annotations

import re

import numpy as np
import torch

from gh200rt.loader.dequant import F16, F32, BF16, QuantizedTensor, dequantize
from gh200rt.loader.errors import ModelLoadError
from gh200rt.loader.gguf_reader import read_gguf

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
}
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}
_LAYER_PATTERN = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")


def hf_name(gguf_name: str) -> str:
    """transformers' name for a GGUF tensor name (unknown names pass through, to be reported as unexpected)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER_PATTERN.match(gguf_name)
    if match and match.group(2) in _LAYER_NAMES:
        return f"model.layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}.{match.group(3)}"
    return gguf_name


def unpermute_rows(weights: np.ndarray, num_heads: int) -> np.ndarray:
    head_half = weights.shape[0] // num_heads // 2
    w = weights.reshape(num_heads, head_half, 2, *weights.shape[1:])
    return w.swapaxes(2, 1).reshape(weights.shape)


def _permuted_heads(arch, name: str) -> int:
    if arch.architecture != "llama":
        return 0
    if ".self_attn.q_proj." in name:
        return arch.num_heads
    if ".self_attn.k_proj." in name:
        return arch.num_kv_heads
    return 0


class GGUFFile:
    def __init__(self, path: str):
        self.path = path
        self.metadata, self.tensors = read_gguf(path)

    @property
    def has_output_weight(self) -> bool:
        return "output.weight" in self.tensors

    def total_bytes(self) -> int:
        return sum(int(t.data.nbytes) for t in self.tensors.values())

    def read(self, writer, arch, dtype: torch.dtype) -> dict[str, QuantizedTensor]:
        """Write every tensor into ``writer``; returns the quantized ones by transformers name."""
        quantized: dict[str, QuantizedTensor] = {}
        for gguf_name, tensor in self.tensors.items():
            name = hf_name(gguf_name)
            shape, ggml_type, raw = tensor.shape, tensor.ggml_type, tensor.data
            if not writer.expects(name):
                writer.write(name, torch.empty(0))
                continue
            try:
                values = dequantize(raw.view(np.uint8), ggml_type, shape)
            except ValueError as e:
                raise ModelLoadError(f"{self.path}: tensor {gguf_name}: {e}") from e
            raw_rows = raw.view(np.uint8).reshape(shape[0], -1) if len(shape) == 2 else raw.view(np.uint8)
            heads = _permuted_heads(arch, name)
            if heads:
                values = unpermute_rows(values, heads)
                raw_rows = unpermute_rows(raw_rows, heads)  # blocks never straddle rows, so rows move whole
            if ggml_type not in (F32, F16, BF16):
                quantized[name] = QuantizedTensor(ggml_type, raw_rows, shape)
            values = np.ascontiguousarray(values)
            if not values.flags.writeable:  # an F32 tensor is a view of the read-only memory map
                values = values.copy()
            writer.write(name, torch.from_numpy(values).to(dtype))
        return quantized
