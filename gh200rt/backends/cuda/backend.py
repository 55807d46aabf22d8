"""The CUDA backend's answers to the engine: the resident linears' form, and the ops in the model's hooks."""
from __future__ import annotations

import torch

from gh200rt.backends.cuda.ops import use_triton_kernels
from gh200rt.config import EngineConfig


def linear_format(model: torch.nn.Module, quantized: dict | None, config: EngineConfig) -> str | None:
    """Resident linears keep their loaded form on a GPU (cuBLAS, the GEMV and host GEMM kernels read it as is)."""
    return None


def resident_forms(module: torch.nn.Module, config: EngineConfig, quantized: dict | None = None) -> None:
    """A module the weight store does not place keeps its loaded form, as resident linears do on a GPU."""


def install_kernels(model: torch.nn.Module, config: EngineConfig, device: str) -> None:
    """Triton kernels where triton imports (``--fused-decode-rows``, ``--enable-pdl``: refused below Hopper, on by
    default from it)."""
    hopper = torch.cuda.get_device_capability(device)[0] >= 9
    if config.model.enable_pdl and not hopper:
        major, minor = torch.cuda.get_device_capability(device)
        raise ValueError(f"--enable-pdl needs a GPU of compute capability 9.0 or newer (Hopper); "
                         f"{torch.cuda.get_device_name(device)} is {major}.{minor}: leave it off")
    pdl = hopper if config.model.enable_pdl is None else config.model.enable_pdl
    use_triton_kernels(model, fused_decode_rows=config.model.fused_decode_rows, pdl=pdl)
