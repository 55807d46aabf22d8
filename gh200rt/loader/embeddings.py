"""A checkpoint's whole embedding matrix, read on its own: a tensor-parallel rank's model holds only its vocabulary
rows, and a draft that shares the target's embeddings (an EAGLE-3 head on rank 0) reads every row."""
from __future__ import annotations

import torch

from gh200rt.loader.errors import ModelLoadError
from gh200rt.loader.resolve import resolve_model_path
from gh200rt.loader.safetensors_dir import open_checkpoint_file, read_tensor, shard_files

HF_NAME = "model.embed_tokens.weight"
GGUF_NAME = "token_embd.weight"


def read_embeddings(model: str, shape: tuple[int, int], dtype: torch.dtype, device: str) -> torch.Tensor:
    """``model``'s (directory, .gguf or alias) input embeddings, ``shape`` (vocabulary, hidden), in ``dtype`` on
    ``device``; ``ModelLoadError`` where the checkpoint has none of that shape."""
    path = resolve_model_path(model)
    if path.endswith(".gguf"):
        from gh200rt.loader.gguf_file import GGUFFile
        values = torch.from_numpy(GGUFFile(path).dense(GGUF_NAME).copy())
    else:
        values = None
        for file in shard_files(path):
            with open_checkpoint_file(file) as f:
                if HF_NAME in f.keys():
                    values = read_tensor(f, file, HF_NAME)
                    break
        if values is None:
            raise ModelLoadError(f"{path} has no {HF_NAME}")
    if tuple(values.shape) != tuple(shape):
        raise ModelLoadError(f"{path}: the embeddings have shape {tuple(values.shape)}, expected {tuple(shape)}")
    return values.to(device=device, dtype=dtype)
