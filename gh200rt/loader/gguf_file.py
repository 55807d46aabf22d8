"""Weights, architecture and tokenizer metadata of a GGUF file (llama-family architectures, dense and MoE).

Tensors are renamed to transformers' names, dequantized to float32 with our numpy dequantizers
and written once into the model; quantized tensors stay reachable as ``QuantizedTensor``. For the
llama architecture (Mixtral included) llama.cpp's converter permuted the rows of q/k weights
(interleaved RoPE layout); ``unpermute_rows`` restores the rotate-half layout transformers uses.

MoE files (``qwen2moe``, ``qwen3moe``, ``llama`` with ``llama.expert_count``) store each sparse layer's
routed experts as three stacks ``blk.N.ffn_{gate,up,down}_exps.weight`` of shape ``[E, rows, cols]``
(numpy order); each is split into the E per-expert checkpoint names the model expects
(``mlp.experts.E.gate_proj.weight``, Mixtral's ``block_sparse_moe.experts.E.w1.weight`` ...), and a
quantized stack is kept per expert as that expert's slice of the file's blocks (blocks never straddle
rows, so a slice is the expert's blocks as stored).
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
_QWEN_MOE = {
    "ffn_gate_inp": "mlp.gate", "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj", "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
}
_MIXTRAL_MOE = {"ffn_gate_inp": "block_sparse_moe.gate"}
# per architecture: the sparse block's single tensors, and each expert stack -> one expert's name ({e}: its index)
_MOE_NAMES = {"qwen2_moe": _QWEN_MOE, "qwen3_moe": _QWEN_MOE, "mixtral": _MIXTRAL_MOE}
_QWEN_STACKS = {"ffn_gate_exps": "mlp.experts.{e}.gate_proj", "ffn_up_exps": "mlp.experts.{e}.up_proj",
                "ffn_down_exps": "mlp.experts.{e}.down_proj"}
_EXPERT_STACKS = {
    "qwen2_moe": _QWEN_STACKS, "qwen3_moe": _QWEN_STACKS,
    "mixtral": {"ffn_gate_exps": "block_sparse_moe.experts.{e}.w1", "ffn_up_exps": "block_sparse_moe.experts.{e}.w3",
                "ffn_down_exps": "block_sparse_moe.experts.{e}.w2"},
}
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}
_LAYER_PATTERN = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")
_EXPERT_PATTERN = re.compile(r"^model\.layers\.(\d+)\.(.+)\.experts\.(\d+)\.([a-z0-9_]+)\.weight$")


def hf_name(gguf_name: str, architecture: str = "llama") -> str:
    """transformers' name for a GGUF tensor name (unknown names pass through, to be reported as unexpected)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER_PATTERN.match(gguf_name)
    if match:
        names = {**_LAYER_NAMES, **_MOE_NAMES.get(architecture, {})}
        if match.group(2) in names:
            return f"model.layers.{match.group(1)}.{names[match.group(2)]}.{match.group(3)}"
    return gguf_name


def expert_names(gguf_name: str, architecture: str, num_experts: int) -> list[str] | None:
    """The per-expert transformers names an expert stack ``blk.N.ffn_*_exps.weight`` splits into, in expert order;
    None for any other tensor."""
    match = _LAYER_PATTERN.match(gguf_name)
    stacks = _EXPERT_STACKS.get(architecture, {})
    if not match or match.group(2) not in stacks or match.group(3) != "weight":
        return None
    pattern = f"model.layers.{match.group(1)}.{stacks[match.group(2)]}.weight"
    return [pattern.format(e=e) for e in range(num_experts)]


def stack_name(name: str, architecture: str) -> str:
    """The GGUF stack an expert's transformers name comes from (for messages: a missing stack is named once, not
    once per expert); other names as they are."""
    match = _EXPERT_PATTERN.match(name)
    if match:
        relative = f"{match.group(2)}.experts.{{e}}.{match.group(4)}"
        for gguf_part, pattern in _EXPERT_STACKS.get(architecture, {}).items():
            if pattern == relative:
                return f"blk.{match.group(1)}.{gguf_part}.weight"
    return name


def unpermute_rows(weights: np.ndarray, num_heads: int) -> np.ndarray:
    head_half = weights.shape[0] // num_heads // 2
    w = weights.reshape(num_heads, head_half, 2, *weights.shape[1:])
    return w.swapaxes(2, 1).reshape(weights.shape)


def _permuted_heads(file_architecture: str, arch, name: str) -> int:
    if file_architecture != "llama":
        return 0
    if ".self_attn.q_proj." in name:
        return arch.num_heads
    if ".self_attn.k_proj." in name:
        return arch.num_kv_heads
    return 0


def _writable(values: np.ndarray) -> np.ndarray:
    values = np.ascontiguousarray(values)
    return values if values.flags.writeable else values.copy()  # an F32 tensor is a view of the read-only map


class GGUFFile:
    def __init__(self, path: str):
        self.path = path
        self.metadata, self.tensors = read_gguf(path)

    @property
    def architecture(self) -> str | None:
        return self.metadata.get("general.architecture")

    @property
    def has_output_weight(self) -> bool:
        return "output.weight" in self.tensors

    def total_bytes(self) -> int:
        return sum(int(t.data.nbytes) for t in self.tensors.values())

    def _dequantize(self, gguf_name: str, raw: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> np.ndarray:
        try:
            return dequantize(raw, ggml_type, shape)
        except ValueError as e:
            raise ModelLoadError(f"{self.path}: tensor {gguf_name}: {e}") from e

    def read(self, writer, arch, dtype: torch.dtype) -> dict[str, QuantizedTensor]:
        """Write every tensor into ``writer``; returns the quantized ones by transformers name (an expert stack's
        by each expert's name)."""
        quantized: dict[str, QuantizedTensor] = {}
        for gguf_name, tensor in self.tensors.items():
            experts = expert_names(gguf_name, arch.architecture, arch.num_experts)
            if experts is not None:
                self._read_experts(gguf_name, tensor, experts, writer, dtype, quantized)
                continue
            name = hf_name(gguf_name, arch.architecture)
            shape, ggml_type, raw = tensor.shape, tensor.ggml_type, tensor.data.view(np.uint8)
            if not writer.expects(name):
                writer.write(name, torch.empty(0))
                continue
            if len(shape) == 1 and len(writer.expected_shape(name)) == 2:
                shape = (1, shape[0])  # Qwen2-MoE's shared expert gate: llama.cpp's converter squeezes [1, H]
            values = self._dequantize(gguf_name, raw, ggml_type, shape)
            raw_rows = raw.reshape(shape[0], -1) if len(shape) == 2 else raw
            heads = _permuted_heads(self.architecture, arch, name)
            if heads:
                values = unpermute_rows(values, heads)
                raw_rows = unpermute_rows(raw_rows, heads)  # blocks never straddle rows, so rows move whole
            if ggml_type not in (F32, F16, BF16):
                quantized[name] = QuantizedTensor(ggml_type, raw_rows, shape)
            writer.write(name, torch.from_numpy(_writable(values)).to(dtype))
        return quantized

    def _read_experts(self, gguf_name: str, tensor, names: list[str], writer, dtype: torch.dtype,
                      quantized: dict[str, QuantizedTensor]) -> None:
        """Split the stack ``gguf_name`` into the experts ``names``, one expert dequantized at a time."""
        if not writer.expects(names[0]):   # a stack in a layer the config makes dense, or past num_experts
            writer.write(gguf_name, torch.empty(0))
            return
        expected = (len(names), *writer.expected_shape(names[0]))
        if tuple(tensor.shape) != expected:
            raise ModelLoadError(f"{self.path}: tensor {gguf_name} has shape {tuple(tensor.shape)} (experts, rows, "
                                 f"columns) but the model config needs {expected}; the file does not match its "
                                 "metadata")
        raw = tensor.data.view(np.uint8).reshape(len(names), expected[1], -1)
        for expert, name in enumerate(names):
            values = self._dequantize(gguf_name, raw[expert], tensor.ggml_type, expected[1:])
            if tensor.ggml_type not in (F32, F16, BF16):
                quantized[name] = QuantizedTensor(tensor.ggml_type, raw[expert], expected[1:])
            writer.write(name, torch.from_numpy(_writable(values)).to(dtype))
