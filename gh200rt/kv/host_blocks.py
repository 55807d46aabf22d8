"""Host KV blocks that attention reads in place: the KV analogue of the ``direct`` weight tier.

A block table entry names a device pool block (``0 .. num_device_blocks - 1``) or, from ``first_id`` on, block
``entry - first_id`` of the host KV tier (kv/host_tier.py), which the attention kernel reads where it lies: over
NVLink-C2C on GH200, over PCIe from pinned memory on an x86 host, from RAM on the CPU platform. A layer's
``HostBlocksView`` is its share of the tier, laid out as its device pool is (``[2, blocks, block_size, kv_heads,
head_dim]`` with the device pool's slot and head strides; the plane and block strides may differ).

Such blocks hold full, published prompt blocks only: a step never writes them (its new tokens' slots are in device
blocks), and the KV cache manager keeps each pinned in the tier while a request reads it (kv/kv_manager.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class HostBlocksView:
    pool: torch.Tensor     # [planes, host blocks, block_size, kv_heads, head_dim]: a view into the tier's memory
    first_id: int          # the table entry that names host block 0: the device pool's block count

    def __post_init__(self):
        assert self.pool.dim() == 5 and self.pool.shape[0] in (1, 2), self.pool.shape
        assert self.first_id > 0, self.first_id


class HostKVLayers:
    """Every layer's ``HostBlocksView`` of the host tier, found by the device pool attention is handed for the layer
    (``for_cache``): a step's metadata carries it (``AttentionMetadata.host_kv``) where tables may name host blocks.

    ``tier``: the host tier as the device reads it, ``[slots, layers, 2, block_size, kv_heads, head_dim]``
    (kv/offload.py lays blocks out so); ``first_id``: the device pool's block count."""

    def __init__(self, kv_caches: list[torch.Tensor], tier: torch.Tensor, first_id: int):
        assert tier.shape[1] == len(kv_caches), (tier.shape, len(kv_caches))
        self.first_id = first_id
        self._views = {cache.data_ptr(): HostBlocksView(tier[:, layer].transpose(0, 1), first_id)
                       for layer, cache in enumerate(kv_caches)}
        assert len(self._views) == len(kv_caches), "two layers share a device pool"

    def for_cache(self, kv_cache: torch.Tensor) -> HostBlocksView:
        return self._views[kv_cache.data_ptr()]


def host_view(meta, kv_cache: torch.Tensor) -> HostBlocksView | None:
    """The host blocks a step's tables may name for the layer whose pool is ``kv_cache`` (None: the device's only).
    Latent attention hands its one-plane pool as K and V (a stride-0 view of it): its host blocks are seen alike."""
    layers = getattr(meta, "host_kv", None)
    if layers is None:
        return None
    view = layers.for_cache(kv_cache)
    if view.pool.shape[0] != kv_cache.shape[0]:
        view = HostBlocksView(view.pool.expand(kv_cache.shape[0], *view.pool.shape[1:]), view.first_id)
    return view


class _HostMemory:
    """``__cuda_array_interface__`` over pinned host memory at a device address; holds the host tensor alive."""

    def __init__(self, host: torch.Tensor, address: int):
        self.host = host
        self.__cuda_array_interface__ = {"shape": (host.nbytes,), "typestr": "|u1", "data": (address, False),
                                         "strides": None, "version": 3}


def device_visible(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` (the tier's memory) as kernels on ``device`` read it in place: itself on the CPU; on CUDA a tensor
    over its mapped device address (pinned memory: NVLink-C2C on GH200, PCIe on x86), no copy."""
    if device.type == "cpu":
        return host
    assert host.is_pinned(), "a GPU reads host KV blocks in place from pinned memory"
    from cuda.bindings import runtime as rt
    err, address = rt.cudaHostGetDevicePointer(host.data_ptr(), 0)
    if err != rt.cudaError_t.cudaSuccess:
        raise RuntimeError(f"the host KV tier cannot be read in place from {device}: cudaHostGetDevicePointer "
                           f"failed ({err.name}); use --kv-offloading-reads load")
    raw = torch.as_tensor(_HostMemory(host, int(address)), device=device)
    view = raw.view(host.dtype).view(host.shape)
    assert view.data_ptr() == int(address), "the device view must not copy the tier"
    return view
