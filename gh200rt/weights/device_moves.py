"""What the weight store moves to the device as it is (everything but offloaded linears), and where a
GGUF or FP8 checkpoint's quantized weights for one fused linear are."""
from __future__ import annotations

import torch

from gh200rt.formats.pack import PackedWeight
from gh200rt.models.layers.linear import RefLinear
from gh200rt.models.llama import FUSED_SHARDS


def weight_nbytes(weight) -> int:
    return weight.nbytes if isinstance(weight, torch.Tensor) else int(weight.nbytes)


def move_to_device(model, device: torch.device, host_layers: set[int], layer_refs=None,
                   host_refs: frozenset[int] = frozenset()) -> tuple[int, dict[int, int]]:
    """Parameters, buffers and every linear weight outside the decoder layers ``host_layers`` and the refs
    ``host_refs`` (ids: experts placed on their own) to ``device``. ``layer_refs(i)``: the refs a layer's tier
    governs (default ``model.layer_weight_refs``). Returns the device bytes placed (each storage once) and
    the bytes of every other layer's ``layer_refs``."""
    layer_refs = layer_refs or model.layer_weight_refs
    if device.type != "cpu":
        model.to(device)
    kept = {id(ref) for i in host_layers for ref in layer_refs(i).values()} | set(host_refs)
    per_layer = {i: sum(weight_nbytes(ref.current) for ref in layer_refs(i).values())
                 for i in range(len(model.layers)) if i not in host_layers}
    seen: dict[int, int] = {}
    for module in model.modules():
        if isinstance(module, RefLinear) and id(module.weight_ref) not in kept:
            ref = module.weight_ref
            if isinstance(ref.current, torch.Tensor) and ref.current.device != device:
                ref.current = ref.current.to(device)
            if isinstance(ref.current, torch.Tensor):
                seen[ref.current.data_ptr()] = ref.current.nbytes
            elif isinstance(ref.current, PackedWeight):   # an FP8 checkpoint's resident weight, kept in fp8
                ref.current = ref.current.with_tensors({n: t.to(device) for n, t in ref.current.tensors().items()})
                seen.update({t.data_ptr(): t.nbytes for t in ref.current.tensors().values()})
    for tensor in [*model.parameters(), *model.buffers()]:
        seen[tensor.data_ptr()] = tensor.nbytes
    return sum(seen.values()), per_layer


# an MoE layer's linears under their checkpoint names: Qwen's (as the model names them) or Mixtral's
# (``block_sparse_moe.``, experts' w1 / w3 / w2)
_MIXTRAL_SHARDS = {"gate_up_proj": ("w1", "w3"), "down_proj": ("w2",)}


def _checkpoint_shards(name: str) -> list[tuple[str, ...]]:
    """The checkpoint names whose rows make up fused linear ``name``, in each naming a checkpoint may use."""
    candidates = [FUSED_SHARDS.get(name, (name,))]
    head, _, last = name.rpartition(".")
    if head.startswith("mlp.experts."):
        candidates.append((f"{head}.gate_proj", f"{head}.up_proj") if last == "gate_up_proj" else (name,))
        mixtral = "block_sparse_moe." + head.removeprefix("mlp.")
        candidates.append(tuple(f"{mixtral}.{part}" for part in _MIXTRAL_SHARDS.get(last, (last,))))
    elif name == "mlp.gate":
        candidates.append(("block_sparse_moe.gate",))
    elif head == "mlp.shared_expert":    # Qwen2-MoE's shared_expert, DeepSeek's shared_experts
        for stem in ("mlp.shared_expert", "mlp.shared_experts"):
            candidates.append((f"{stem}.gate_proj", f"{stem}.up_proj") if last == "gate_up_proj"
                              else (f"{stem}.{last}",))
    elif name == "self_attn.q_b_proj":   # latent attention without q_lora_rank: the checkpoint's q_proj
        candidates.append(("self_attn.q_proj",))
    return candidates


def gguf_parts(quantized: dict | None, layer: int, name: str) -> list | None:
    """The checkpoint's quantized tensors (GGUF blocks, or an FP8 checkpoint's fp8 weights) whose rows make up
    linear ``name`` of ``layer`` (an MoE expert's too), or None when any is not quantized."""
    if not quantized:
        return None
    prefix = f"model.layers.{layer}."
    for shards in _checkpoint_shards(name):
        parts = [f"{prefix}{part}.weight" for part in shards]
        if all(p in quantized for p in parts):
            return [quantized[p] for p in parts]
    return None


def linear_parts(quantized: dict | None, tied: bool, layer: int | None, name: str) -> list | None:
    """``gguf_parts`` of a decoder layer's linear, or (``layer`` None) ``lm_head_parts``."""
    return gguf_parts(quantized, layer, name) if layer is not None else lm_head_parts(quantized, tied)


def lm_head_parts(quantized: dict | None, tied: bool) -> list | None:
    """The checkpoint's quantized lm_head (its own, or the embedding it is tied to), or None."""
    key = "model.embed_tokens.weight" if tied else "lm_head.weight"
    return [quantized[key]] if quantized and key in quantized else None
