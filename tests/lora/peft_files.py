"""PEFT LoRA adapter directories written by hand in PEFT's exact format (peft is not installed here), and the
reference they are judged against: the transformers model with ``W + scale * B @ A`` merged into each target
(what ``PeftModel.merge_and_unload`` computes)."""
from __future__ import annotations

import copy
import json
import math
import os

import torch

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
ALL_LINEARS = (*ATTENTION, "gate_proj", "up_proj", "down_proj")
# DeepSeek-V2 / V3's latent attention (q_proj where the checkpoint has no q_lora_rank)
LATENT = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def peft_config(r: int, alpha: float, targets, use_rslora: bool = False, base: str = "tiny", **changes) -> dict:
    """adapter_config.json as PEFT 0.13+ writes it for a LoRA on a causal LM."""
    return {"alpha_pattern": {}, "auto_mapping": None, "base_model_name_or_path": base, "bias": "none",
            "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": True, "layer_replication": None,
            "layers_pattern": None, "layers_to_transform": None, "loftq_config": {}, "lora_alpha": alpha,
            "lora_dropout": 0.0, "megatron_config": None, "megatron_core": "megatron.core", "modules_to_save": None,
            "peft_type": "LORA", "r": r, "rank_pattern": {}, "revision": None, "target_modules": sorted(targets),
            "task_type": "CAUSAL_LM", "use_dora": False, "use_rslora": use_rslora, **changes}


def linear_of(hf_model, layer: int, module: str):
    block = "self_attn" if module in ATTENTION or module in LATENT else "mlp"
    return getattr(getattr(hf_model.model.layers[layer], block), module), block


def write_peft_adapter(path: str, hf_model, r: int, alpha: float, targets=ALL_LINEARS, seed: int = 0,
                       use_rslora: bool = False, layers=None, config_changes: dict | None = None,
                       extra_tensors: dict | None = None, layer_targets=None) -> str:
    """A random (trained-looking: B is not zero) adapter on ``targets`` of ``layers`` (default all);
    ``layer_targets(layer)``, where given, names a layer's targets instead (an MoE model's dense layers)."""
    os.makedirs(path, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for i in (range(len(hf_model.model.layers)) if layers is None else layers):
        for module in (targets if layer_targets is None else layer_targets(i)):
            lin, block = linear_of(hf_model, i, module)
            key = f"base_model.model.model.layers.{i}.{block}.{module}"
            tensors[f"{key}.lora_A.weight"] = 0.3 * torch.randn(r, lin.in_features, generator=gen)
            tensors[f"{key}.lora_B.weight"] = 0.3 * torch.randn(lin.out_features, r, generator=gen)
    tensors.update(extra_tensors or {})
    from safetensors.torch import save_file
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump(peft_config(r, alpha, targets, use_rslora, **(config_changes or {})), f, indent=2)
    return path


@torch.no_grad()
def merged_model(hf_model, path: str):
    """A copy of ``hf_model`` with the adapter in ``path`` merged: ``W += scale * B @ A``."""
    from safetensors.torch import load_file
    with open(os.path.join(path, "adapter_config.json")) as f:
        config = json.load(f)
    r, alpha = config["r"], config["lora_alpha"]
    scale = alpha / math.sqrt(r) if config["use_rslora"] else alpha / r
    tensors = load_file(os.path.join(path, "adapter_model.safetensors"))
    merged = copy.deepcopy(hf_model)
    for key, a in tensors.items():
        if not key.endswith(".lora_A.weight"):
            continue
        b = tensors[key.replace("lora_A", "lora_B")]
        parts = key.split(".")
        layer, module = int(parts[4]), parts[6]
        lin, _ = linear_of(merged, layer, module)
        lin.weight += scale * (b.double() @ a.double()).float()
    return merged
