"""Host slabs as the device sees them: page-locked for DMA, and viewed in place for DIRECT reads.

- ``prepare_slab_for_device(slab, platform)``: on a CUDA platform, register the slab with CUDA at
  its exact size (``cudaHostRegister``), so STREAMED copies are DMA at full link speed and can be
  captured into graphs; on x86 the registration is also *mapped*, which gives the GPU a device
  pointer to it. Call it once per slab, before any copy or view. On the cpu platform: nothing.
- ``device_view(slab, platform, device)``: a uint8 tensor of ``slab.nbytes`` that kernels on
  ``device`` read in place (no copy): ``slab.tensor`` on the cpu platform; on GH200 (ATS) a CUDA
  tensor over the host address itself; on x86 a CUDA tensor over the mapped device pointer. The
  view keeps the slab's mapping alive; free the slab only after its views are gone.
- ``direct_weight(view)``: what a ``WeightRef`` holds for a dense ``[out, in]`` weight read in
  place: on CPU the view itself (torch reads host memory); on CUDA a ``HostDenseWeight`` whose
  ``linear`` runs the ``host_gemm`` Triton kernel, which streams each weight byte once over the
  link, instead of cuBLAS.
"""
from __future__ import annotations

import torch


def prepare_slab_for_device(slab, platform) -> None:
    if platform.kind == "cpu":
        return
    slab.register_cuda(mapped=not platform.ats)


def device_address(slab, platform) -> int:
    """The address a GPU kernel dereferences to read ``slab`` in place."""
    return slab.address if platform.ats else slab.device_pointer()


class _SlabDeviceMemory:
    """``__cuda_array_interface__`` over a slab; torch keeps this object (and so the slab) alive
    for as long as a tensor built from it exists."""

    def __init__(self, slab, address: int):
        self.slab = slab
        self.host = slab.tensor  # holds the host mapping open even if the slab object is freed early
        self.__cuda_array_interface__ = {"shape": (slab.nbytes,), "typestr": "|u1", "data": (address, False),
                                         "strides": None, "version": 3}


def device_view(slab, platform, device) -> torch.Tensor:
    if platform.kind == "cpu":
        return slab.tensor
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device_view on a {platform.kind} platform needs a cuda device, got {device}")
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    address = device_address(slab, platform)
    try:
        view = torch.as_tensor(_SlabDeviceMemory(slab, address), device=device)
    except RuntimeError as exc:
        raise RuntimeError(f"cannot view the {slab.nbytes}-byte host slab at 0x{slab.address:x} from {device}: "
                           f"{exc}. Call prepare_slab_for_device(slab, platform) once before device_view") from exc
    assert view.data_ptr() == address and view.device == device, "device_view must not copy the slab"
    return view


class HostDenseWeight:
    """A dense ``[out, in]`` weight in host memory that GPU kernels read in place (the DIRECT tier)."""

    def __init__(self, view: torch.Tensor):
        assert view.dim() == 2 and view.is_cuda and view.stride(-1) == 1, (view.shape, view.device, view.stride())
        self.view = view

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.view.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.view.dtype

    @property
    def nbytes(self) -> int:
        return self.view.nbytes

    @property
    def device(self) -> torch.device:
        return self.view.device

    def storage(self) -> dict[str, torch.Tensor]:
        """The memory this weight reads (what a captured graph sees)."""
        return {"view": self.view}

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        # the kernel reads each weight byte once per 64 rows of x: ideal for decode; a long prefill
        # re-reads the weight over the link once per 64 tokens (correct, but link-bound)
        from gh200rt.kernels.triton import host_gemm as host_gemm_module
        return host_gemm_module.host_gemm(x, self.view, bias)

    def __repr__(self) -> str:
        return f"HostDenseWeight({list(self.view.shape)}, {self.view.dtype}, at 0x{self.view.data_ptr():x})"


def direct_weight(view: torch.Tensor):
    """``view`` itself on CPU; a ``HostDenseWeight`` (``linear``, ``nbytes``, ``shape``, ``dtype``) on CUDA."""
    return HostDenseWeight(view) if view.is_cuda else view
