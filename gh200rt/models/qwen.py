"""Qwen2 (bias on q/k/v) and Qwen3 (per-head q/k RMSNorm), dense and MoE: the Llama decoder with those
ArchConfig flags on."""
from __future__ import annotations

from gh200rt.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    """``arch.attention_bias`` adds the qkv bias; names and fusion are Llama's."""


class Qwen3ForCausalLM(LlamaForCausalLM):
    """``arch.qk_norm`` adds ``self_attn.q_norm`` / ``k_norm`` applied per head before RoPE."""


class Qwen2MoeForCausalLM(LlamaForCausalLM):
    """Qwen2's attention (qkv bias); sparse layers route to experts and add a sigmoid-gated shared expert."""


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    """Qwen3's attention (q/k norm); sparse layers route to experts (``models/moe.py``)."""
