"""DeepSeek-V3 (and Kimi-K2, the same architecture): the Llama decoder with multi-head latent attention
(``layers/mla.py``) in every layer, dense MLPs in the first ``first_k_dense_replace`` layers and DeepSeekMoE blocks
after them (``moe.py``: sigmoid, group-limited routing with a correction bias; ungated shared experts)."""
from __future__ import annotations

from gh200rt.models.llama import LlamaForCausalLM


class DeepseekV3ForCausalLM(LlamaForCausalLM):
    """``arch.is_mla`` gives every layer a ``LatentAttention``; ``arch.scoring_func == "sigmoid"`` the routing."""
