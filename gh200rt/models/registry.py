"""Architecture name -> model class."""
from __future__ import annotations

import torch

from gh200rt.models.arch_config import SUPPORTED_ARCHITECTURES, ArchConfig
from gh200rt.models.deepseek import DeepseekV2ForCausalLM, DeepseekV3ForCausalLM
from gh200rt.models.glm import Glm4MoeForCausalLM
from gh200rt.models.llama import LlamaForCausalLM
from gh200rt.models.mixtral import MixtralForCausalLM
from gh200rt.models.qwen import Qwen2ForCausalLM, Qwen2MoeForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM

MODEL_CLASSES = {
    "llama": LlamaForCausalLM,
    "mistral": LlamaForCausalLM,
    "qwen2": Qwen2ForCausalLM,
    "qwen3": Qwen3ForCausalLM,
    "qwen2_moe": Qwen2MoeForCausalLM,
    "qwen3_moe": Qwen3MoeForCausalLM,
    "mixtral": MixtralForCausalLM,
    "deepseek_v2": DeepseekV2ForCausalLM,
    "deepseek_v3": DeepseekV3ForCausalLM,
    "glm4_moe": Glm4MoeForCausalLM,
}
assert set(MODEL_CLASSES) == set(SUPPORTED_ARCHITECTURES)


def build_model(arch: ArchConfig, dtype: torch.dtype, device: torch.device | str = "cpu") -> LlamaForCausalLM:
    """An uninitialised model (``torch.empty`` storage) for the loader to fill."""
    cls = MODEL_CLASSES.get(arch.architecture)
    if cls is None:
        raise ValueError(f"unsupported architecture {arch.architecture!r}; "
                         f"gh200rt supports: {', '.join(SUPPORTED_ARCHITECTURES)}")
    with torch.inference_mode(False):
        return cls(arch, dtype, device).eval()
