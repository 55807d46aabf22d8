"""``install_lora``: give a loaded model its LoRA slots and return the engine's adapter registry."""
from __future__ import annotations

import torch

from gh200rt.lora.registry import AdapterRegistry
from gh200rt.lora.slots import LoraSlots, slot_bytes
from gh200rt.lora.step import LoraBatch


def lora_slot_bytes(config, arch, dtype: torch.dtype) -> int:
    """What ``lora_slots`` books in the ledger for ``config`` (the engine's ``LoRAConfig``); 0 without LoRA."""
    return slot_bytes(arch, config.max_loras, config.max_lora_rank, dtype) if config.enable_lora else 0


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def install_lora(model, arch, config, dtype: torch.dtype, device, ledger, shard=None,
                 register_modules: bool = True) -> AdapterRegistry:
    """Slots on ``device`` (``ledger`` must have booked ``lora_slot_bytes`` as ``lora_slots`` already: the KV cache
    takes what is left), a ``LoraLinear`` on each target linear, and the ``--lora-modules`` read and registered
    (``register_modules``: a tensor-parallel worker loads what rank 0 names instead). ``arch``: the model's (a
    rank's, where ``shard`` says which of the whole model's ``shard.arch``)."""
    if not all(hasattr(layer, "self_attn") and (hasattr(layer.self_attn, "qkv_proj")
                                                or hasattr(layer.self_attn, "kv_b_proj"))
               for layer in getattr(model, "layers", [None])):
        raise ValueError(f"--enable-lora serves adapters of Llama-family models (Llama, Mistral, Qwen2/3, their MoE "
                         f"families, DeepSeek-V2/V3); {type(model).__name__} has no such decoder layers")
    use_triton = torch.device(device).type == "cuda" and _triton_available()
    batch = LoraBatch(config.max_loras, device, use_triton)
    slots = LoraSlots(model, arch, config.max_loras, config.max_lora_rank, dtype, device, batch)
    assert ledger.by_kind["lora_slots"] == slots.nbytes, (ledger.by_kind["lora_slots"], slots.nbytes)
    registry = AdapterRegistry(config, shard.arch if shard is not None else arch, dtype, slots, batch, shard)
    for module in config.modules if register_modules else ():
        registry.add(module.name, module.path, module.base_model_name)
    return registry
