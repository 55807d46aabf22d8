"""The ``mtp`` method's draft: the multi-token-prediction layer the target's checkpoint ships
(``models/mtp.py``), read from the checkpoint's safetensors files, its names only (an FP8 checkpoint's weights
dequantized with their block scales), or from a GGUF file's ``nextn`` block (llama.cpp's names, quantized blocks
dequantized), checked strictly, and drafting through ``hidden_drafter.py`` from the target's
final hidden states. One layer drafts every position: a step's k drafts feed it its own output k times (vLLM does the
same; the layer was trained for the first, so acceptance falls with the position)."""
from __future__ import annotations

import functools
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
    layer = MultiTokenPredictor(arch, dtype, device)       # written in place: its expert stacks stay one tensor
    writer = LayerWriter(layer, path)
    try:
        with torch.inference_mode():
            source_name = read_gguf_blocks(path, writer, arch, dtype) if path.endswith(".gguf") else \
                read_safetensors_layer(path, writer, dtype)
        writer.finish(source_name)
    except ModelLoadError as e:
        raise ValueError(f"--speculative-config: method mtp: {e} (the checkpoint declares num_nextn_predict_layers "
                         f"{arch.num_nextn_predict_layers}; use a checkpoint that ships the layer, or another "
                         f"method)") from None
    return layer.eval()


def read_safetensors_layer(path: str, writer: LayerWriter, dtype: torch.dtype) -> None:
    """The layer's tensors of a safetensors checkpoint (an FP8 one's dequantized with their block scales)."""
    from gh200rt.loader.fp8_checkpoint import Fp8Weights, fp8_block_size, fp8_scheme
    from gh200rt.loader.load import config_json
    from gh200rt.loader.safetensors_dir import load_safetensors, shard_files, weight_scales
    config = config_json(path)
    files = shard_files(path)
    fp8 = Fp8Weights(weight_scales(files), path, None, fp8_block_size(config)) \
        if fp8_scheme(config, os.path.join(path, "config.json")) else None
    load_safetensors(files, writer, dtype, fp8)


def read_gguf_blocks(path: str, writer: LayerWriter, arch: ArchConfig, dtype: torch.dtype):
    """The layer's tensors of a GGUF file: its ``nextn`` block (llama.cpp's names, quantized blocks dequantized);
    returns what names a missing weight's GGUF tensor."""
    from gh200rt.loader.gguf_file import GGUFFile, stack_name
    GGUFFile(path).read(writer, arch, dtype, nextn=True)
    return functools.partial(stack_name, architecture=arch.architecture)
