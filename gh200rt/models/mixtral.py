"""Mixtral: Mistral's attention; every layer's MLP a ``SparseMoeBlock`` named ``block_sparse_moe`` in checkpoints."""
from __future__ import annotations

from gh200rt.models.llama import LlamaForCausalLM


class MixtralForCausalLM(LlamaForCausalLM):
    """Experts ``w1`` / ``w3`` / ``w2`` (gate / up / down); softmax over the top-k router logits."""
