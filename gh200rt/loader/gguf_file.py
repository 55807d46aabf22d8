"""Weights, architecture and tokenizer metadata of a GGUF file (llama-family architectures, dense and MoE).

Tensors are renamed to transformers' names, dequantized to float32 with our numpy dequantizers
and written once into the model; quantized tensors stay reachable as ``QuantizedTensor``. For the
llama architecture (Mixtral included) llama.cpp's converter permuted the rows of q/k weights
(interleaved RoPE layout); ``unpermute_rows`` restores the rotate-half layout transformers uses.

MoE files (``qwen2moe``, ``qwen3moe``, ``llama`` with ``llama.expert_count``, ``deepseek2``) store each sparse layer's
routed experts as three stacks ``blk.N.ffn_{gate,up,down}_exps.weight`` of shape ``[E, rows, cols]``
(numpy order); each is split into the E per-expert checkpoint names the model expects
(``mlp.experts.E.gate_proj.weight``, Mixtral's ``block_sparse_moe.experts.E.w1.weight`` ...), and a
quantized stack is kept per expert as that expert's slice of the file's blocks (blocks never straddle
rows, so a slice is the expert's blocks as stored). A ``deepseek2`` file's latent attention keeps ``attn_kv_b`` whole
(older files) or split into ``attn_k_b`` / ``attn_v_b`` (``_join_kv_b`` puts them back together), and its
multi-token-prediction blocks past the model's are skipped.

A tensor-parallel rank (``shard``, a ``distributed.sharding.TensorShard``) reads only its slice of each tensor's
blocks from the memory map, by transformers name as ``TensorShard.checkpoint_slices`` gives it. Rows
(column-parallel: q/k/v, gate/up, experts' gate/up, vocabulary rows) are exact since blocks never straddle rows;
columns (row-parallel: o, down, experts' down) are exact where the rank's columns start and end on a block
boundary (K/N a multiple of 32 values for the block types read here), and a tensor whose columns do not is refused
naming it, its block size and N (dequantizing the straddled blocks would be exact too, but would leave that
tensor without its quantized form on the rank). llama's q/k permutation moves rows only within a head, so the
rank's rows are whole heads before and after it, and are un-permuted with the rank's head count.
"""
from __future__ import annotations

import re

import numpy as np
import torch

from gh200rt.loader.dequant import BF16, BLOCK, F16, F32, TYPE_NAMES, QuantizedTensor, dequantize
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
# deepseek2 (DeepSeek-V2 / V3, Kimi-K2): latent attention and DeepSeekMoE. Newer files split attn_kv_b into attn_k_b
# (W_UK per head, transposed) and attn_v_b (W_UV per head); ``GGUFFile`` joins them back into kv_b_proj
_DEEPSEEK = {
    "attn_q_a": "self_attn.q_a_proj", "attn_q_a_norm": "self_attn.q_a_layernorm", "attn_q_b": "self_attn.q_b_proj",
    "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa", "attn_kv_a_norm": "self_attn.kv_a_layernorm",
    "attn_kv_b": "self_attn.kv_b_proj", "ffn_gate_inp": "mlp.gate",
    "ffn_gate_shexp": "mlp.shared_experts.gate_proj", "ffn_up_shexp": "mlp.shared_experts.up_proj",
    "ffn_down_shexp": "mlp.shared_experts.down_proj", "exp_probs_b": "mlp.gate.e_score_correction",
}
_SPLIT_KV_B = {"attn_k_b": "k", "attn_v_b": "v"}
# per architecture: the sparse block's single tensors, and each expert stack -> one expert's name ({e}: its index)
_MOE_NAMES = {"qwen2_moe": _QWEN_MOE, "qwen3_moe": _QWEN_MOE, "mixtral": _MIXTRAL_MOE, "deepseek_v2": _DEEPSEEK,
              "deepseek_v3": _DEEPSEEK}
_QWEN_STACKS = {"ffn_gate_exps": "mlp.experts.{e}.gate_proj", "ffn_up_exps": "mlp.experts.{e}.up_proj",
                "ffn_down_exps": "mlp.experts.{e}.down_proj"}
_EXPERT_STACKS = {
    "qwen2_moe": _QWEN_STACKS, "qwen3_moe": _QWEN_STACKS, "deepseek_v2": _QWEN_STACKS, "deepseek_v3": _QWEN_STACKS,
    "mixtral": {"ffn_gate_exps": "block_sparse_moe.experts.{e}.w1", "ffn_up_exps": "block_sparse_moe.experts.{e}.w3",
                "ffn_down_exps": "block_sparse_moe.experts.{e}.w2"},
}
# a multi-token-prediction block's own tensors (``blk.N.nextn.*``, N past the model's blocks), as llama.cpp writes
# DeepSeek-V3's and GLM-4.5's layer; its decoder tensors are named as any block's
_NEXTN_NAMES = {"eh_proj": "eh_proj", "enorm": "enorm", "hnorm": "hnorm", "embed_tokens": "embed_tokens",
                "shared_head_head": "shared_head.head", "shared_head_norm": "shared_head.norm"}
_NEXTN_PATTERN = re.compile(r"^blk\.(\d+)\.nextn\.([a-z_]+)\.weight$")
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}
_LAYER_PATTERN = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")
_BLOCK_PATTERN = re.compile(r"^blk\.(\d+)\.(.+)$")
_EXPERT_PATTERN = re.compile(r"^model\.layers\.(\d+)\.(.+)\.experts\.(\d+)\.([a-z0-9_]+)\.weight$")


def hf_name(gguf_name: str, architecture: str = "llama") -> str:
    """transformers' name for a GGUF tensor name (unknown names pass through, to be reported as unexpected)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _NEXTN_PATTERN.match(gguf_name)
    if match and match.group(2) in _NEXTN_NAMES:
        return f"model.layers.{match.group(1)}.{_NEXTN_NAMES[match.group(2)]}.weight"
    match = _LAYER_PATTERN.match(gguf_name)
    if match:
        names = {**_LAYER_NAMES, **_MOE_NAMES.get(architecture, {})}
        if match.group(2) in names:
            # DeepSeek's correction bias is one name in transformers (``e_score_correction_bias``)
            joint = "_" if match.group(2) == "exp_probs_b" else "."
            return f"model.layers.{match.group(1)}.{names[match.group(2)]}{joint}{match.group(3)}"
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
    if name.endswith(".self_attn.kv_b_proj.weight") and architecture in ("deepseek_v2", "deepseek_v3"):
        block = f"blk.{name.split('.')[2]}"
        return f"{block}.attn_kv_b.weight (or {block}.attn_k_b.weight and {block}.attn_v_b.weight)"
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

    def dense(self, gguf_name: str) -> np.ndarray:
        """Tensor ``gguf_name`` whole, dequantized (float32); ``ModelLoadError`` where the file lacks it."""
        tensor = self.tensors.get(gguf_name)
        if tensor is None:
            raise ModelLoadError(f"{self.path} has no tensor {gguf_name}")
        return self._dequantize(gguf_name, tensor.data.view(np.uint8), tensor.ggml_type, tuple(tensor.shape))

    def _dequantize(self, gguf_name: str, raw: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> np.ndarray:
        try:
            return dequantize(raw, ggml_type, shape)
        except ValueError as e:
            raise ModelLoadError(f"{self.path}: tensor {gguf_name}: {e}") from e

    def _check_block_bounds(self, gguf_name: str, ggml_type: int, width: int, start: int, stop: int,
                            world_size: int) -> None:
        per_block = BLOCK[ggml_type][0]
        if start % per_block or stop % per_block:
            raise ModelLoadError(
                f"{self.path}: tensor {gguf_name} is {TYPE_NAMES[ggml_type]}, whose blocks hold {per_block} values "
                f"of a row; with --tensor-parallel-size {world_size} a rank reads columns [{start}, {stop}) of its "
                f"{width}, which do not start and end on a block boundary ({width}/{world_size} must be a "
                f"multiple of {per_block}); choose a size N for which it is, or a file with this tensor in F16/F32")

    def check_shard(self, shard) -> None:
        """Raise ``ModelLoadError`` (before any rank reads a weight) where ``shard``'s columns of a row-parallel
        tensor do not start and end on block boundaries; every rank's bounds are ``shard.rank``'s plus a multiple
        of K/N, so rank 0's check holds for all."""
        slices = shard.checkpoint_slices()
        architecture, experts = shard.arch.architecture, shard.arch.num_experts
        for gguf_name, tensor in self.tensors.items():
            names = expert_names(gguf_name, architecture, experts) or [hf_name(gguf_name, architecture)]
            part = slices.get(names[0])
            if part is not None and part[0] == 1 and len(tensor.shape) >= 2:
                self._check_block_bounds(gguf_name, tensor.ggml_type, tensor.shape[-1], part[1], part[2],
                                         shard.world_size)

    def _slice(self, gguf_name: str, raw: np.ndarray, ggml_type: int, shape: tuple[int, ...], part, world_size: int):
        """The raw blocks and shape of ``part`` (dim, start, stop) of a tensor: rows, or columns on block bounds."""
        if part is None:
            return raw, shape
        dim, start, stop = part
        per_block, block_bytes = BLOCK[ggml_type]
        if len(shape) == 2 and dim == 0:
            return raw.reshape(shape[0], -1)[start:stop], (stop - start, shape[1])
        self._check_block_bounds(gguf_name, ggml_type, shape[-1], start, stop, world_size)
        cut = slice(start // per_block * block_bytes, stop // per_block * block_bytes)
        if len(shape) == 1:        # a bias
            return raw[cut], (stop - start,)
        return raw.reshape(shape[0], -1)[:, cut], (shape[0], stop - start)

    def read(self, writer, arch, dtype: torch.dtype, shard=None, nextn: bool = False) -> dict[str, QuantizedTensor]:
        """Write every tensor into ``writer``; returns the quantized ones by transformers name (an expert stack's
        by each expert's name). ``arch`` is the whole model's; ``shard``: read only that rank's slices; ``nextn``:
        the multi-token-prediction blocks' tensors only (past the model's blocks), else everything but them."""
        quantized: dict[str, QuantizedTensor] = {}
        slices = shard.checkpoint_slices() if shard is not None else {}
        world_size = shard.world_size if shard is not None else 1
        halves: dict[int, dict[str, tuple[str, object]]] = {}   # deepseek2's attn_k_b / attn_v_b by layer
        for gguf_name, tensor in self.tensors.items():
            block = _BLOCK_PATTERN.match(gguf_name)
            in_nextn = bool(block and int(block.group(1)) >= arch.num_layers and arch.num_nextn_predict_layers)
            if nextn and not in_nextn:
                continue
            if in_nextn and not nextn:
                # a multi-token-prediction block: loaded and skipped, as from safetensors (WeightWriter's log)
                writer.write(f"model.layers.{block.group(1)}.{block.group(2)}", torch.empty(0))
                continue
            layer_part = _LAYER_PATTERN.match(gguf_name)
            if layer_part and layer_part.group(2) in _SPLIT_KV_B and arch.is_mla:
                layer = int(layer_part.group(1))
                halves.setdefault(layer, {})[_SPLIT_KV_B[layer_part.group(2)]] = (gguf_name, tensor)
                if len(halves[layer]) == 2:
                    self._join_kv_b(layer, halves.pop(layer), writer, arch, dtype, slices)
                continue
            experts = expert_names(gguf_name, arch.architecture, arch.num_experts)
            if experts is not None:
                self._read_experts(gguf_name, tensor, experts, writer, dtype, quantized, slices, world_size)
                continue
            name = hf_name(gguf_name, arch.architecture)
            shape, ggml_type, raw = tensor.shape, tensor.ggml_type, tensor.data.view(np.uint8)
            if not writer.expects(name):
                writer.write(name, torch.empty(0))
                continue
            if len(shape) == 1 and len(writer.expected_shape(name)) == 2:
                shape = (1, shape[0])  # Qwen2-MoE's shared expert gate: llama.cpp's converter squeezes [1, H]
            full_rows = shape[0]
            raw, shape = self._slice(gguf_name, raw, ggml_type, shape, slices.get(name), world_size)
            values = self._dequantize(gguf_name, raw, ggml_type, shape)
            raw_rows = raw.reshape(shape[0], -1) if len(shape) == 2 else raw
            heads = _permuted_heads(self.architecture, arch, name) * shape[0] // full_rows  # the rank's whole heads
            if heads:
                values = unpermute_rows(values, heads)
                raw_rows = unpermute_rows(raw_rows, heads)  # blocks never straddle rows, so rows move whole
            if ggml_type not in (F32, F16, BF16):
                quantized[name] = QuantizedTensor(ggml_type, np.ascontiguousarray(raw_rows), shape)
            writer.write(name, torch.from_numpy(_writable(values)).to(dtype))
        for layer, half in halves.items():
            present, missing = ("attn_k_b", "attn_v_b") if "k" in half else ("attn_v_b", "attn_k_b")
            raise ModelLoadError(f"{self.path}: blk.{layer}.{present}.weight is here but blk.{layer}.{missing}.weight "
                                 f"is not; a deepseek2 file holds both halves of attn_kv_b (or attn_kv_b itself)")
        return quantized

    def _join_kv_b(self, layer: int, halves: dict, writer, arch, dtype: torch.dtype, slices: dict) -> None:
        """kv_b_proj ``[heads x (nope + v), kv_lora_rank]`` from llama.cpp's attn_k_b ``[heads, rank, nope]`` (W_UK
        transposed) and attn_v_b ``[heads, v, rank]`` (a tensor-parallel rank: its heads' rows). Dequantized:
        kv_b_proj stays dense wherever it is placed (models/layers/mla.py), so no block form is kept."""
        heads, rank, nope, v = arch.num_heads, arch.kv_lora_rank, arch.qk_nope_head_dim, arch.v_head_dim
        parts = {}
        for half, want in (("k", (heads, rank, nope)), ("v", (heads, v, rank))):
            gguf_name, tensor = halves[half]
            if tuple(tensor.shape) != want:
                raise ModelLoadError(f"{self.path}: tensor {gguf_name} has shape {tuple(tensor.shape)} but the model "
                                     f"config needs {want} (heads, rows, columns); the file does not match its "
                                     "metadata")
            rows = want[0] * want[1]
            raw = tensor.data.view(np.uint8).reshape(rows, -1)
            parts[half] = self._dequantize(gguf_name, raw, tensor.ggml_type, (rows, want[2])).reshape(want)
        joined = np.concatenate([parts["k"].transpose(0, 2, 1), parts["v"]], axis=1).reshape(heads * (nope + v), rank)
        name = f"model.layers.{layer}.self_attn.kv_b_proj.weight"
        part = slices.get(name)
        if part is not None:
            assert part[0] == 0, part       # split by heads: rows
            joined = joined[part[1]:part[2]]
        writer.write(name, torch.from_numpy(_writable(joined)).to(dtype))

    def _read_experts(self, gguf_name: str, tensor, names: list[str], writer, dtype: torch.dtype,
                      quantized: dict[str, QuantizedTensor], slices: dict, world_size: int) -> None:
        """Split the stack ``gguf_name`` into the experts ``names``, one expert dequantized at a time (a rank: its
        slice of each expert)."""
        if not writer.expects(names[0]):   # a stack in a layer the config makes dense, or past num_experts
            writer.write(gguf_name, torch.empty(0))
            return
        expected = (len(names), *writer.expected_shape(names[0]))
        shape = tuple(tensor.shape)
        part = slices.get(names[0])
        if part is not None and len(shape) == 3:      # the rank's rows or columns of each expert
            dim, start, stop = part
            within = start <= stop <= shape[1 + dim]
            shape = (*shape[:1 + dim], stop - start, *shape[2 + dim:]) if within else shape
        if shape != expected:
            raise ModelLoadError(f"{self.path}: tensor {gguf_name} has shape {tuple(tensor.shape)} (experts, rows, "
                                 f"columns) but the model config needs {expected}; the file does not match its "
                                 "metadata")
        raw = tensor.data.view(np.uint8).reshape(len(names), tensor.shape[1], -1)
        for expert, name in enumerate(names):
            blocks, _ = self._slice(gguf_name, raw[expert], tensor.ggml_type, tuple(tensor.shape[1:]), part, world_size)
            values = self._dequantize(gguf_name, blocks, tensor.ggml_type, expected[1:])
            if tensor.ggml_type not in (F32, F16, BF16):
                quantized[name] = QuantizedTensor(tensor.ggml_type, np.ascontiguousarray(blocks), expected[1:])
            writer.write(name, torch.from_numpy(_writable(values)).to(dtype))
