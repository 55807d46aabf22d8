"""Weights of a Hugging Face directory: ``model.safetensors`` or shards listed in
``model.safetensors.index.json``, read through memory maps (safetensors ``safe_open``)."""
from __future__ import annotations

import json
import os

import torch
from safetensors import safe_open

from gh200rt.loader.errors import ModelLoadError
from gh200rt.loader.weight_writer import FULL_PRECISION_SUFFIXES, WeightWriter


def shard_files(directory: str) -> list[str]:
    single = os.path.join(directory, "model.safetensors")
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise ModelLoadError(f"{index} is not a valid safetensors index ({e})") from e
        files = sorted(set(weight_map.values()))
        absent = [f for f in files if not os.path.isfile(os.path.join(directory, f))]
        if absent:
            raise ModelLoadError(f"{index} lists shard files that do not exist: {', '.join(absent)}")
        return [os.path.join(directory, f) for f in files]
    if os.path.isfile(single):
        return [single]
    raise ModelLoadError(f"model directory {directory} has no model.safetensors or model.safetensors.index.json "
                         f"(only safetensors checkpoints are supported)")


def open_checkpoint_file(path: str):
    try:
        return safe_open(path, framework="pt")
    except Exception as e:  # safetensors raises SafetensorError for truncated / corrupt headers
        raise ModelLoadError(f"{path} is truncated or corrupt and cannot be read as safetensors: {e}") from e


def checkpoint_size(files: list[str]) -> tuple[int, int]:
    count = size = 0
    for path in files:
        with open_checkpoint_file(path) as f:
            count += len(list(f.keys()))
        size += os.path.getsize(path)
    return count, size


def read_tensor(f, path: str, name: str, part: tuple[int, int, int] | None = None) -> torch.Tensor:
    """Tensor ``name``, or only its ``part`` (dim, start, stop): the rest is never read."""
    try:
        if part is None:
            return f.get_tensor(name)
        dim, start, stop = part
        view = f.get_slice(name)
        return view[start:stop] if dim == 0 else view[:, start:stop]
    except Exception as e:
        raise ModelLoadError(f"{path} is truncated or corrupt: reading {name} failed ({e})") from e


def weight_scales(files: list[str]) -> dict[str, torch.Tensor]:
    """Every ``*.weight_scale`` (``*.weight_scale_inv``: block scales) of an FP8 checkpoint (small; read first, since a shard may end between a
    weight and its scale)."""
    scales = {}
    for path in files:
        with open_checkpoint_file(path) as f:
            scales.update({name: read_tensor(f, path, name) for name in f.keys()
                           if name.endswith((".weight_scale", ".weight_scale_inv"))})
    return scales


def load_safetensors(files: list[str], writer: WeightWriter, dtype: torch.dtype, fp8=None,
                     slices: dict[str, tuple[int, int, int]] | None = None, deferred=None) -> None:
    """Write every tensor of ``files`` through ``writer`` in ``dtype``; ``fp8`` (loader.fp8_checkpoint.Fp8Weights)
    when the checkpoint is FP8: its weights are dequantized with their scales and kept in fp8 too. ``slices``:
    name -> (dim, start, stop) of the tensors of which only that part is read (a tensor-parallel rank's).
    ``deferred`` (loader.deferred_layers.DeferredLayers): the tensors it defers are checked against the header
    (shape, dtype) and noted for it to read later, not read now."""
    for path in files:
        with open_checkpoint_file(path) as f:
            for name in f.keys():
                if deferred is not None and deferred.defers(name):
                    part = (slices or {}).get(name)
                    _check_stored_dtype(f, path, name)
                    writer.defer(name, _stored_shape(f, name, part))
                    deferred.note(path, name, part, writer.destinations[name])
                    continue
                if fp8 is not None and fp8.is_kv_scale(name):
                    fp8.note_kv_scale(name, read_tensor(f, path, name))
                    continue
                if fp8 is not None and fp8.is_weight_scale(name):  # read up front (weight_scales)
                    continue
                if not writer.expects(name):
                    writer.write(name, torch.empty(0))  # records it as unexpected (or ignored)
                    continue
                tensor = read_tensor(f, path, name, (slices or {}).get(name))
                if name.endswith(FULL_PRECISION_SUFFIXES):
                    writer.write(name, tensor)
                elif fp8 is not None:
                    writer.write(name, fp8.dense(name, tensor, dtype))
                elif tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
                    raise _unscaled_fp8(path, name, tensor.dtype)
                else:
                    writer.write(name, tensor.to(dtype))


def _unscaled_fp8(path: str, name: str, dtype) -> ModelLoadError:
    return ModelLoadError(f"{path}: {name} is stored as {dtype} but config.json has no quantization_config "
                          "describing its scales; add the checkpoint's quantization_config (or use its unquantized "
                          "original)")


def _check_stored_dtype(f, path: str, name: str) -> None:
    dtype = f.get_slice(name).get_dtype()
    if dtype.startswith("F8"):
        raise _unscaled_fp8(path, name, dtype)


def _stored_shape(f, name: str, part: tuple[int, int, int] | None) -> tuple[int, ...]:
    """The shape ``name`` (or its ``part``) has in the file, from the header alone."""
    shape = list(f.get_slice(name).get_shape())
    if part is not None:
        dim, start, stop = part
        shape[dim] = len(range(*slice(start, stop).indices(shape[dim])))
    return tuple(shape)
