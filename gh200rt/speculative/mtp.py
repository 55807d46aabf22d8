"""The ``mtp`` method's draft: the multi-token-prediction layer the target's checkpoint ships
(``models/mtp.py``), read from the checkpoint's safetensors files, its names only (an FP8 checkpoint's weights
dequantized with their block scales), checked strictly, and drafting through ``hidden_drafter.py`` from the target's
final hidden states. One layer drafts every position: a step's k drafts feed it its own output k times (vLLM does the
same; the layer was trained for the first, so acceptance falls with the position)."""
from __future__ import annotations

import os

import torch

from gh200rt.loader.errors import ModelLoadError
from gh200rt.loader.resolve import resolve_model_path
from gh200rt.loader.weight_writer import WeightWriter
from gh200rt.models.arch_config import ArchConfig
from gh200rt.models.mtp import MultiTokenPredictor


class LayerWriter(WeightWriter):
    """Writes the tensors under one layer's prefix; every other name of the checkpoint is the target's."""

    def __init__(self, model: MultiTokenPredictor, source: str):
        super().__init__(model, source, 0, 0)
        self.prefix = model.prefix

    def write(self, name: str, tensor: torch.Tensor) -> None:
        if name.startswith(self.prefix):
            super().write(name, tensor)


def load_mtp(checkpoint: str, arch: ArchConfig, dtype: torch.dtype, device: str) -> MultiTokenPredictor:
    """The first multi-token-prediction layer of ``checkpoint`` (the target's, described by ``arch``) on
    ``device``; ``ValueError`` that says what to do where there is none to read."""
    if not getattr(arch, "num_nextn_predict_layers", 0):     # models built by hand may not say
        raise ValueError("--speculative-config: method mtp drafts with the multi-token-prediction layer a checkpoint "
                         "ships (num_nextn_predict_layers in its config.json), and this model has none; use ngram, "
                         "suffix, draft_model or eagle3")
    try:
        path = resolve_model_path(checkpoint)
    except ModelLoadError as e:
        raise ValueError(f"--speculative-config: method mtp reads its layer from {checkpoint!r}: {e}") from None
    if path.endswith(".gguf"):
        raise ValueError(f"--speculative-config: method mtp reads the layer from a Hugging Face safetensors "
                         f"checkpoint; {path} is a GGUF file, whose nextn blocks are not read yet: serve the "
                         f"safetensors checkpoint, or use ngram or suffix")
    from gh200rt.loader.fp8_checkpoint import Fp8Weights, fp8_block_size, fp8_scheme
    from gh200rt.loader.load import config_json
    from gh200rt.loader.safetensors_dir import load_safetensors, shard_files, weight_scales
    config = config_json(path)
    files = shard_files(path)
    fp8 = Fp8Weights(weight_scales(files), path, None, fp8_block_size(config)) \
        if fp8_scheme(config, os.path.join(path, "config.json")) else None
    layer = MultiTokenPredictor(arch, dtype, device)       # written in place: its expert stacks stay one tensor
    writer = LayerWriter(layer, path)
    with torch.inference_mode():
        load_safetensors(files, writer, dtype, fp8)
    try:
        writer.finish()
    except ModelLoadError as e:
        raise ValueError(f"--speculative-config: method mtp: {e} (its config.json declares num_nextn_predict_layers "
                         f"{arch.num_nextn_predict_layers}; use a checkpoint that ships the layer, or another "
                         f"method)") from None
    return layer.eval()
