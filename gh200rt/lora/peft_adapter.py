"""Read a PEFT LoRA directory (``adapter_config.json`` + ``adapter_model.safetensors``) for a loaded model.

Strict, like the model loader: every tensor must land on a linear gh200rt has (q/k/v -> ``qkv_proj``, o, gate/up ->
``gate_up_proj``, down of a dense MLP; latent attention's q_proj or q_a_proj / q_b_proj, kv_a_proj_with_mqa,
kv_b_proj and o_proj) with the base model's shapes, and everything else is refused by name: experts, DoRA,
embedding or lm_head adapters, ``modules_to_save``, LoRA biases, per-module rank or alpha patterns, ranks above
``--max-lora-rank``. Tensors stay compact (rank r) in host memory, in the compute dtype; ``slots.py`` places them.
PEFT saves ``lora_A [r, in]`` and ``lora_B [out, r]`` for ``nn.Linear`` targets whatever ``fan_in_fan_out`` says
(PEFT itself resets it for ``nn.Linear``), so that flag changes nothing here.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field

import torch

from gh200rt.models.arch_config import ArchConfig

# checkpoint module -> (fused linear, part index)
PARTS = {
    "q_proj": ("self_attn.qkv_proj", 0), "k_proj": ("self_attn.qkv_proj", 1), "v_proj": ("self_attn.qkv_proj", 2),
    "o_proj": ("self_attn.o_proj", 0), "gate_proj": ("mlp.gate_up_proj", 0), "up_proj": ("mlp.gate_up_proj", 1),
    "down_proj": ("mlp.down_proj", 0),
}
# the same for latent attention (DeepSeek-V2 / V3, models/layers/mla.py): its linears are not fused; a checkpoint
# without q_lora_rank names its one query linear q_proj, which gh200rt holds as q_b_proj
LATENT_PARTS = {
    "q_proj": ("self_attn.q_b_proj", 0), "q_a_proj": ("self_attn.q_a_proj", 0), "q_b_proj": ("self_attn.q_b_proj", 0),
    "kv_a_proj_with_mqa": ("self_attn.kv_a_proj_with_mqa", 0), "kv_b_proj": ("self_attn.kv_b_proj", 0),
    "o_proj": ("self_attn.o_proj", 0), "gate_proj": ("mlp.gate_up_proj", 0), "up_proj": ("mlp.gate_up_proj", 1),
    "down_proj": ("mlp.down_proj", 0),
}
NOT_LINEARS = ("embed_tokens", "lm_head")
_KEY = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+?)\.lora_([AB])(?:\.\w+)?\.weight$")
_EXPERT_KEY = re.compile(r"^base_model\.model\.model\.layers\.\d+\.mlp\.(experts|shared_experts?|gate)\.")


def parts_of(arch: ArchConfig) -> dict[str, tuple[str, int]]:
    """Checkpoint module -> (gh200rt's linear, part index) for ``arch``'s decoder layers."""
    if not arch.is_mla:
        return PARTS
    absent = ("q_proj",) if arch.q_lora_rank else ("q_a_proj", "q_b_proj")
    return {name: part for name, part in LATENT_PARTS.items() if name not in absent}


class LoraAdapterError(ValueError):
    """An adapter directory gh200rt cannot serve; the message names the directory, what is wrong and what works."""


def target_shapes(arch: ArchConfig, layer: int) -> dict[str, tuple[int, tuple[int, ...]]]:
    """Fused linear -> (in features, out features of each part) of decoder layer ``layer`` (no MLP targets in an
    MoE layer: its experts take no adapters)."""
    if arch.is_mla:
        heads, hidden = arch.num_heads, arch.hidden_size
        shapes = {"self_attn.q_b_proj": (arch.q_lora_rank or hidden,
                                         (heads * (arch.qk_nope_head_dim + arch.head_dim),)),
                  "self_attn.kv_a_proj_with_mqa": (hidden, (arch.kv_lora_rank + arch.head_dim,)),
                  "self_attn.kv_b_proj": (arch.kv_lora_rank, (heads * (arch.qk_nope_head_dim + arch.v_head_dim),)),
                  "self_attn.o_proj": (heads * arch.v_head_dim, (hidden,))}
        if arch.q_lora_rank:
            shapes["self_attn.q_a_proj"] = (hidden, (arch.q_lora_rank,))
    else:
        shapes = {"self_attn.qkv_proj": (arch.hidden_size, (arch.q_size, arch.kv_size, arch.kv_size)),
                  "self_attn.o_proj": (arch.q_size, (arch.hidden_size,))}
    if not arch.is_moe_layer(layer):
        shapes["mlp.gate_up_proj"] = (arch.hidden_size, (arch.intermediate_size, arch.intermediate_size))
        shapes["mlp.down_proj"] = (arch.intermediate_size, (arch.hidden_size,))
    return shapes


@dataclass
class LoraAdapter:
    """One adapter in host memory: per (layer, fused linear), per part, ``(A [r, in], B [out_part, r])`` or None
    where the adapter leaves that part alone."""
    path: str
    rank: int
    scale: float
    weights: dict[tuple[int, str], list[tuple[torch.Tensor, torch.Tensor] | None]] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for parts in self.weights.values() for p in parts if p for a, b in [p])


def _config(path: str) -> dict:
    file = os.path.join(path, "adapter_config.json")
    if not os.path.isdir(path):
        raise LoraAdapterError(f"LoRA adapter {path!r}: no such directory; give a PEFT adapter directory (with "
                               "adapter_config.json and adapter_model.safetensors)")
    try:
        with open(file, encoding="utf-8") as f:
            config = json.load(f)
    except FileNotFoundError:
        raise LoraAdapterError(f"LoRA adapter {path!r} has no adapter_config.json; is it a PEFT adapter "
                               "directory?") from None
    except json.JSONDecodeError as e:
        raise LoraAdapterError(f"{file} is not valid JSON: {e}") from e
    if not isinstance(config, dict):
        raise LoraAdapterError(f"{file} must hold a JSON object")
    return config


def _check_config(path: str, config: dict, max_rank: int, parts: dict[str, tuple[str, int]]) -> tuple[int, float]:
    """(rank, scale) after refusing what gh200rt does not serve."""
    def refuse(what: str):
        raise LoraAdapterError(f"LoRA adapter {path!r}: {what}")

    if config.get("peft_type", "LORA") != "LORA":
        refuse(f"peft_type is {config.get('peft_type')!r}; only LORA adapters are served")
    if config.get("use_dora"):
        refuse("DoRA (use_dora) is not supported; serve a plain LoRA adapter or merge the DoRA weights")
    if config.get("modules_to_save"):
        refuse(f"modules_to_save {config['modules_to_save']} holds full copies of other modules, which are not "
               "supported; train without modules_to_save")
    if config.get("bias", "none") != "none" or config.get("lora_bias"):
        refuse("LoRA biases (bias / lora_bias) are not supported; train with bias='none'")
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        refuse("per-module rank_pattern / alpha_pattern are not supported; train with one r and lora_alpha")
    if config.get("layer_replication"):
        refuse("layer_replication is not supported")
    targets = config.get("target_modules")
    named = [targets] if isinstance(targets, str) and re.fullmatch(r"\w+", targets) else \
        targets if isinstance(targets, list) else []
    for name in named:
        if name == "all-linear":
            continue
        short = name.rsplit(".", 1)[-1]
        if short in NOT_LINEARS:
            refuse(f"target module {name!r}: adapters on the embedding or lm_head are not supported; adapt the "
                   f"decoder linears ({', '.join(parts)})")
        if short not in parts:
            refuse(f"target module {name!r} is not a linear this model has; supported: {', '.join(parts)}")
    rank, alpha = config.get("r"), config.get("lora_alpha", config.get("r"))
    if not isinstance(rank, int) or rank < 1 or not isinstance(alpha, (int, float)):
        refuse(f"adapter_config.json needs a positive integer r and a number lora_alpha, got r={rank!r} "
               f"lora_alpha={alpha!r}")
    if rank > max_rank:
        refuse(f"rank r={rank} exceeds --max-lora-rank {max_rank}; raise --max-lora-rank to at least {rank}")
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return rank, float(scale)


def _tensors(path: str) -> dict[str, torch.Tensor]:
    file = os.path.join(path, "adapter_model.safetensors")
    if not os.path.exists(file):
        hint = " (adapter_model.bin found: save it with safe_serialization=True)" if os.path.exists(
            os.path.join(path, "adapter_model.bin")) else ""
        raise LoraAdapterError(f"LoRA adapter {path!r} has no adapter_model.safetensors{hint}")
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    try:
        return load_file(file)
    except (SafetensorError, OSError) as e:
        raise LoraAdapterError(f"{file} cannot be read: {e}") from e


def read_peft_adapter(path: str, arch: ArchConfig, max_rank: int, dtype: torch.dtype) -> LoraAdapter:
    parts = parts_of(arch)
    rank, scale = _check_config(path, _config(path), max_rank, parts)
    adapter = LoraAdapter(path, rank, scale)
    halves: dict[tuple[int, str, int], dict[str, torch.Tensor]] = {}
    for key, tensor in _tensors(path).items():
        m = _KEY.match(key)
        if m is None and _EXPERT_KEY.match(key):
            raise LoraAdapterError(f"LoRA adapter {path!r}: tensor {key!r} adapts an MoE layer's experts or router; "
                                   "adapters on experts are not supported (train without the expert linears, e.g. "
                                   "target_modules without mlp.experts / shared_experts)")
        if m is None:
            what = ("an embedding adapter" if "embedding" in key or "embed_tokens" in key else
                    "an lm_head adapter" if "lm_head" in key else
                    "a DoRA magnitude" if "magnitude" in key else "not a decoder linear's lora_A / lora_B")
            raise LoraAdapterError(f"LoRA adapter {path!r}: tensor {key!r} is {what}, which is not supported")
        layer, block, module, half = int(m.group(1)), m.group(2), m.group(3), m.group(4)
        if module not in parts or not parts[module][0].startswith(block + "."):
            raise LoraAdapterError(f"LoRA adapter {path!r}: tensor {key!r} adapts {block}.{module}, which this "
                                   f"model does not have (supported: {', '.join(parts)})")
        if layer >= arch.num_layers:
            raise LoraAdapterError(f"LoRA adapter {path!r}: tensor {key!r} is for layer {layer} but the model has "
                                   f"{arch.num_layers} layers; was it trained for another base model?")
        target, part = parts[module]
        shapes = target_shapes(arch, layer)
        if target not in shapes:
            raise LoraAdapterError(f"LoRA adapter {path!r}: tensor {key!r} adapts an MoE layer's MLP; adapters on "
                                   "experts are not supported")
        fan_in, outs = shapes[target]
        want = (rank, fan_in) if half == "A" else (outs[part], rank)
        if tuple(tensor.shape) != want:
            raise LoraAdapterError(f"LoRA adapter {path!r}: tensor {key!r} has shape {tuple(tensor.shape)} but this "
                                   f"base model needs {want} (r={rank}); was it trained for another base model?")
        halves.setdefault((layer, target, part), {})[half] = tensor.to(dtype).contiguous()
    for (layer, target, part), pair in sorted(halves.items()):
        if set(pair) != {"A", "B"}:
            missing = "lora_B" if "A" in pair else "lora_A"
            raise LoraAdapterError(f"LoRA adapter {path!r}: layer {layer} {target} part {part} has no {missing}")
        held = adapter.weights.setdefault((layer, target), [None] * len(target_shapes(arch, layer)[target][1]))
        held[part] = (pair["A"], pair["B"])
    if not adapter.weights:
        raise LoraAdapterError(f"LoRA adapter {path!r} holds no lora_A / lora_B tensors")
    return adapter
