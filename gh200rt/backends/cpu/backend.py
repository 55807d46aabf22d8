"""The CPU backend's answers to the engine: the resident linears' form, and the ops in the model's hooks."""
from __future__ import annotations

import logging

import torch

from gh200rt.backends.cpu.ops import use_native_cpu_kernels, use_torch_cpu_kernels
from gh200rt.backends.cpu.prepack import GGUF_ROW_FORMATS, cpu_route_form, resident_linear_format
from gh200rt.backends.cpu.routes import describe, route_for
from gh200rt.config import EngineConfig
from gh200rt.models.layers.mla import ABSORBED_WEIGHTS
from gh200rt.weights.device_moves import linear_parts

log = logging.getLogger(__name__)


def linear_format(model: torch.nn.Module, quantized: dict | None, config: EngineConfig) -> str | None:
    """The form resident linears take on this CPU's route (``--dtype``, ``--cpu-route``, ``--cpu-kernels``)."""
    route = route_for(config.model.dtype, config.model.cpu_route)
    log.info("%s", describe(route))
    return resident_linear_format(model, route.linear_format, quantized,
                                  native_kernels=config.model.cpu_kernels == "native")


def resident_forms(module: torch.nn.Module, config: EngineConfig, quantized: dict | None = None) -> None:
    """A module the weight store does not place (a speculative draft, an EAGLE-3 head, a multi-token-prediction
    layer): each dense linear in the form resident ones take on this route (AMX tiles, reordered fp32, fp16...);
    ``quantized``: the module's checkpoint blocks (a GGUF draft), which its linears keep for single rows where the
    route does so for the target (a draft decodes one row a sequence)."""
    route = route_for(config.model.dtype, config.model.cpu_route)
    fmt = resident_linear_format(module, route.linear_format, quantized,
                                 native_kernels=config.model.cpu_kernels == "native")
    if fmt is None:
        return
    tied = getattr(getattr(module, "arch", None), "tie_word_embeddings", False)
    with torch.inference_mode():
        for name, linear in module.named_modules():
            weight = getattr(getattr(linear, "weight_ref", None), "current", None)
            if isinstance(weight, torch.Tensor) and weight.device.type == "cpu" and \
                    not name.endswith(ABSORBED_WEIGHTS) and linear.lora is None:
                parts = _checkpoint_parts(quantized, tied, name) if fmt in GGUF_ROW_FORMATS else None
                linear.weight_ref.current = cpu_route_form(weight, fmt if parts else GGUF_ROW_FORMATS.get(fmt, fmt),
                                                           parts, gated=name.endswith("gate_up_proj"))


def _checkpoint_parts(quantized: dict | None, tied: bool, module_name: str) -> list | None:
    """The checkpoint blocks of linear ``module_name`` (``layers.3.self_attn.qkv_proj``, ``lm_head``), or None."""
    if module_name == "lm_head":
        return linear_parts(quantized, tied, None, module_name)
    head, _, rest = module_name.partition(".")
    index, _, name = rest.partition(".")
    return linear_parts(quantized, tied, int(index), name) if head == "layers" and index.isdigit() else None


def install_kernels(model: torch.nn.Module, config: EngineConfig, device: str = "cpu") -> None:
    """The native ops, or torch's (``--cpu-kernels torch``, or no C compiler: logged)."""
    if config.model.cpu_kernels == "torch":
        use_torch_cpu_kernels(model)
        return
    why_not = use_native_cpu_kernels(model, long_prompts_native=config.model.batch_invariant)
    if why_not is not None:
        log.warning("the CPU model keeps torch's small ops (slower per step): %s", why_not)
