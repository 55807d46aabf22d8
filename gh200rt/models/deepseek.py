"""DeepSeek-V3 (and Kimi-K2, the same architecture) and DeepSeek-V2: the Llama decoder with multi-head latent
attention (``layers/mla.py``) in every layer, dense MLPs in the first ``first_k_dense_replace`` layers and DeepSeekMoE
blocks after them (``moe.py``: V3's sigmoid, group-limited routing with a correction bias, V2's softmax routing;
ungated shared experts)."""
from __future__ import annotations

from gh200rt.models.llama import LlamaForCausalLM


class DeepseekV3ForCausalLM(LlamaForCausalLM):
    """``arch.is_mla`` gives every layer a ``LatentAttention``; ``arch.scoring_func == "sigmoid"`` the routing."""


class DeepseekV2ForCausalLM(LlamaForCausalLM):
    """V3's layers with V2's softmax router (``arch.topk_method`` greedy or group_limited_greedy)."""
