"""The CPU backend's answers to the engine: the resident linears' form, and the ops in the model's hooks."""
from __future__ import annotations

import logging

import torch

from gh200rt.backends.cpu.ops import use_native_cpu_kernels, use_torch_cpu_kernels
from gh200rt.backends.cpu.prepack import resident_linear_format
from gh200rt.backends.cpu.routes import describe, route_for
from gh200rt.config import EngineConfig

log = logging.getLogger(__name__)


def linear_format(model: torch.nn.Module, quantized: dict | None, config: EngineConfig) -> str | None:
    """The form resident linears take on this CPU's route (``--dtype``, ``--cpu-route``, ``--cpu-kernels``)."""
    route = route_for(config.model.dtype, config.model.cpu_route)
    log.info("%s", describe(route))
    return resident_linear_format(model, route.linear_format, quantized,
                                  native_kernels=config.model.cpu_kernels == "native")


def install_kernels(model: torch.nn.Module, config: EngineConfig, device: str = "cpu") -> None:
    """The native ops, or torch's (``--cpu-kernels torch``, or no C compiler: logged)."""
    if config.model.cpu_kernels == "torch":
        use_torch_cpu_kernels(model)
        return
    why_not = use_native_cpu_kernels(model, long_prompts_native=config.model.batch_invariant)
    if why_not is not None:
        log.warning("the CPU model keeps torch's small ops (slower per step): %s", why_not)
