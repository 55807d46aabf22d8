"""The forms a resident layer's linears take on the device, and what goes there at placement.

``ResidentForms`` is a part of ``WeightStore`` (store.py). On the CPU platform a resident linear is converted into
the CPU route's fastest form (``cpu_linear_format``: oneDNN's reordered fp32, fp16 with the GGUF blocks kept...);
on a GPU a resident layer of an FP8 checkpoint keeps its fp8 weights. ``_move_to_device`` moves everything but the
offloaded linears (device_moves.py). The methods here use the store's attributes (``cpu_linear_format``,
``quantized``, ``tiers``).
"""
from __future__ import annotations

import torch

from gh200rt.backends.cpu.prepack import GGUF_ROW_FORMATS, cpu_route_form, run_route_probes, side_by_side
from gh200rt.formats.packed_weight import concat_rows
from gh200rt.models.layers.mla import ABSORBED_WEIGHTS
from gh200rt.weights.device_moves import gguf_parts, linear_parts, move_to_device
from gh200rt.weights.tiers import Tier


class ResidentForms:
    def _keep_fp8_resident(self) -> None:
        """On a GPU, a resident layer of an FP8 checkpoint keeps its fp8 weights (half the HBM of bf16, read by
        host_gemm with the row scales) instead of the dequantized copy the loader made."""
        for layer in self.layers(Tier.RESIDENT):
            for name, ref in self.model.layer_weight_refs(layer).items():
                parts = gguf_parts(self.quantized, layer, name)
                if parts:
                    ref.current = concat_rows(parts)

    def _resident_form(self, weight, layer: int | None, name: str, threads: int = 1):
        """The CPU route's form of a resident linear (``layer`` None: the lm_head); a tall fp16 weight's pieces are
        packed on up to ``threads`` threads."""
        if self.cpu_linear_format is None or not isinstance(weight, torch.Tensor) or weight.device.type != "cpu" \
                or name in ABSORBED_WEIGHTS:
            return weight
        with torch.inference_mode():
            return cpu_route_form(weight, self.cpu_linear_format, self._route_parts(layer, name),
                                  gated=name.endswith("gate_up_proj"), threads=threads)

    def _resident_forms(self, weights: dict, layer: int) -> dict:
        """``_resident_form`` of each of a layer's linears ``{name: weight}``, made side by side on this thread's
        torch threads (Llama-3-8B's fp16 forms on two cores: 1.8x; ``bench kernel route-forms``)."""
        if self.cpu_linear_format is None:
            return weights
        run_route_probes(self.cpu_linear_format)
        threads = torch.get_num_threads()   # a worker thread's count is not this thread's
        return side_by_side(weights, lambda name, weight: self._resident_form(weight, layer, name, threads), threads)

    def _route_parts(self, layer: int | None, name: str) -> list | None:
        """The GGUF blocks the ``fp16+gguf`` / ``onednn-bf16+gguf`` form of a resident linear keeps (``layer``
        None: the lm_head)."""
        if self.cpu_linear_format not in GGUF_ROW_FORMATS:
            return None
        return linear_parts(self.quantized, self.model.arch.tie_word_embeddings, layer, name)

    def _move_to_device(self, resident_layers: bool = True) -> int:
        """Everything but the offloaded layers' linear weights (and, with ``resident_layers=False``, the
        resident layers' too: they go to the arena) goes to the device; returns its bytes."""
        resident = self.layers(Tier.RESIDENT) if resident_layers else []
        on_host = {i for i in range(len(self.tiers)) if i not in resident}
        in_slabs = frozenset(id(ref) for layer in self.expert_slabs for expert in self._expert_refs(layer)
                             for ref in expert.values())
        placed, per_layer = move_to_device(self.model, self.device, on_host, self._layer_refs, in_slabs)
        self._layer_device_bytes.update({layer: per_layer[layer] for layer in resident})
        return placed
