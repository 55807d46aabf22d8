"""GLM-4.5 / 4.6 (``glm4_moe``): the Llama decoder with q/k/v bias, the optional per-head q/k RMSNorm, RoPE over the
first half of each head (``ArchConfig.rotary_dim``), dense first layers and DeepSeek-V3's MoE blocks after them
(``moe.py``: sigmoid, group-limited routing with a correction bias; ungated shared experts)."""
from __future__ import annotations

from gh200rt.models.llama import LlamaForCausalLM


class Glm4MoeForCausalLM(LlamaForCausalLM):
    """``arch.rotary_dim`` rotates part of each head; ``arch.scoring_func == "sigmoid"`` routes as DeepSeek-V3."""
