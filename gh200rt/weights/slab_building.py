"""How an offloaded layer's host slab is built: read back from the slab cache, quantized from the checkpoint's
memory map, or made from the weights the model holds.

``SlabBuilding`` is a part of ``WeightStore`` (store.py); ``ExpertPlacement`` builds its expert slabs with the same
helpers. Each linear takes its host form (forms.py) in one ``LayerSlab`` on the platform's host NUMA node. With
``slab_cache`` (slab_cache.py) a quantized slab is read back from disk instead of quantized again; with
``deferred`` (loader/deferred_layers.py) a layer's dense linears stay in the checkpoint until the store needs them.
The methods here use the store's attributes (``host_format``, ``quantized``, ``platform``, ``quant_workers``).
"""
from __future__ import annotations

import torch

from gh200rt.weights import forms as weight_forms
from gh200rt.weights.device_moves import gguf_parts
from gh200rt.weights.layer_slab import LayerSlab


class SlabBuilding:
    def _host_form(self, layer: int, name: str, weight):
        if not isinstance(weight, torch.Tensor) and not hasattr(weight, "tensors"):
            raise ValueError(f"layer {layer}'s {name} is held as {type(weight).__name__}, which has no host "
                             f"form; start the engine with every layer's host copy kept (dynamic tiers)")
        if not isinstance(weight, torch.Tensor):
            return weight
        return weight_forms.host_form(weight.cpu(), self.host_format, gguf_parts(self.quantized, layer, name),
                                      self.quant_workers)

    def _build_slab(self, layer: int, refs) -> None:
        weights = {name: ref.current for name, ref in refs.items()}
        node, cache, key = self.platform.host_numa_node, self._cacheable(layer, weights), f"layer-{layer}"
        if cache is not None:
            slab = LayerSlab.from_cache({name: self._meta_form(w) for name, w in weights.items()}, node,
                                        self.platform, self.device, cache, key, self.quant_workers)
            if slab is not None:
                self.slabs[layer] = slab
                return
        if self.deferred is not None and self.deferred.pending(layer):   # quantized from the checkpoint's map
            quantized = self.deferred.host_forms(layer, self.host_format, self.quant_workers)
            assert quantized.keys() == weights.keys(), (sorted(quantized), sorted(weights))
            forms = {name: quantized[name] for name in weights}       # the layout's order: the cache compares it
        else:
            forms = {name: self._host_form(layer, name, weight) for name, weight in weights.items()}
        self.slabs[layer] = slab = LayerSlab(forms, node, self.platform, self.device)
        if cache is not None:
            cache.write(key, slab.layout, slab.tensor[:slab.layout.nbytes])

    def _load_deferred(self, layer: int) -> None:
        """``layer``'s dense linears read from the checkpoint now, where the loader left them there."""
        if self.deferred is not None and self.deferred.pending(layer):
            self.deferred.load(layer)

    def _cacheable(self, layer: int, weights: dict[str, object]):
        """The slab cache, where it applies to these weights: dense ones the host format quantizes (a GGUF or FP8
        checkpoint's own blocks are kept as they are, nothing to save)."""
        if self.slab_cache is None or self.host_format not in weight_forms.QUANTIZED_HOST_FORMATS:
            return None
        if any(not isinstance(w, torch.Tensor) or gguf_parts(self.quantized, layer, name) for name, w in weights.items()):
            return None
        return self.slab_cache

    def _meta_form(self, weight: torch.Tensor):
        """The host form of ``weight`` over storage-free tensors: its layout, without quantizing anything."""
        return weight_forms.empty_host_form(weight, self.host_format)
