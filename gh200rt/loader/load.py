"""``load_model``: a ModelConfig in, a filled model with its tokenizer and metadata out."""
from __future__ import annotations

import functools
import json
import os
import time
from dataclasses import dataclass, field

import torch

from gh200rt.distributed.sharded_model import build_sharded_model
from gh200rt.formats.pack import PackedWeight
from gh200rt.loader.deferred_layers import DeferredLayers
from gh200rt.loader.dequant import QuantizedTensor
from gh200rt.loader.errors import ModelLoadError
from gh200rt.loader.resolve import resolve_model_path
from gh200rt.loader.weight_writer import WeightWriter, mtp_prefixes
from gh200rt.models.arch_config import ArchConfig
from gh200rt.models.registry import build_model
from gh200rt.tokenizer import Tokenizer

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: Tokenizer
    arch: ArchConfig
    dtype: torch.dtype
    source: str
    load_seconds: float
    weight_bytes: int
    # checkpoint name -> its quantized form as stored: GGUF blocks, or an FP8 checkpoint's fp8 weight
    quantized: dict[str, QuantizedTensor | PackedWeight] = field(default_factory=dict)
    # decoder layers' dense linear weights left in the checkpoint until the weight store loads them
    deferred: DeferredLayers | None = None


def compute_dtype(name: str, device: str, checkpoint_dtype: str, cpu_route: str = "auto") -> torch.dtype:
    """On the CPU, the dtype of the route ``--dtype`` and ``--cpu-route`` give (the weight store converts
    resident linears for the same route); on a GPU, ``name`` or for auto the checkpoint's."""
    if name != "auto" and name not in _DTYPES:
        raise ModelLoadError(f"dtype {name!r} is not supported; choose auto, {', '.join(_DTYPES)}")
    if str(device).startswith("cpu"):
        from gh200rt.backends.cpu.routes import route_for
        return route_for(name, cpu_route).dtype
    if name == "auto":
        return _DTYPES.get(checkpoint_dtype, torch.bfloat16)  # GGUF / fp32 checkpoints compute in bf16 on GPU
    return _DTYPES[name]


def config_json(directory: str) -> dict:
    path = os.path.join(directory, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path} is not valid JSON: {e}") from e


def _arch_from_dir(directory: str) -> ArchConfig:
    path = os.path.join(directory, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            return ArchConfig.from_hf_config(json.load(f))
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path} is not valid JSON: {e}") from e
    except KeyError as e:
        raise ModelLoadError(f"{path} lacks the field {e.args[0]!r}") from e
    except ValueError as e:
        raise ModelLoadError(f"{path}: {e}") from e


def _load_hf_dir(directory: str, model_config, device: str, compute_device: str, shard=None, defer=False):
    from gh200rt.loader.fp8_checkpoint import Fp8Weights, fp8_block_size, fp8_scheme
    from gh200rt.loader.safetensors_dir import checkpoint_size, load_safetensors, shard_files, weight_scales
    arch = _arch_from_dir(directory)
    config = config_json(directory)
    is_fp8 = fp8_scheme(config, os.path.join(directory, "config.json"))
    dtype = compute_dtype(model_config.dtype, compute_device, arch.checkpoint_dtype, model_config.cpu_route)
    files = shard_files(directory)
    model = build_model(arch, dtype, device) if shard is None else build_sharded_model(shard, arch, dtype, device)
    if shard is not None:
        arch = model.arch      # the rank's heads, KV heads and MLP width
    count, size = checkpoint_size(files)
    writer = WeightWriter(model, directory, count, size)
    slices = shard.checkpoint_slices() if shard is not None else None
    fp8 = Fp8Weights(weight_scales(files), directory, slices, fp8_block_size(config)) if is_fp8 else None
    deferred = DeferredLayers(model, dtype) if defer and not is_fp8 else None
    load_safetensors(files, writer, dtype, fp8, slices, deferred)
    writer.finish()
    if fp8 is not None:
        # the multi-token-prediction layer's weights are read past here (speculative/mtp.py reads them), their
        # scales with them
        skipped = mtp_prefixes(arch)
        unused = [name for name in fp8.unused_scales() if not (skipped and name.startswith(skipped))]
        if unused:
            raise ModelLoadError(f"{directory}: weight_scale entries without an fp8 weight: "
                                 f"{', '.join(unused[:8])}")
        fp8.apply_kv_scales(model)
        return model, _hf_tokenizer(directory), arch, dtype, writer.bytes_written, fp8.packed
    if deferred is not None and not deferred.pending_layers:
        deferred = None
    return model, _hf_tokenizer(directory), arch, dtype, writer.bytes_written, {}, deferred


def _hf_tokenizer(directory: str):
    from gh200rt.tokenizer.hf_dir import tokenizer_from_hf_dir
    try:
        return tokenizer_from_hf_dir(directory)
    except ValueError as e:
        raise ModelLoadError(str(e)) from e


def _load_gguf(path: str, model_config, device: str, compute_device: str, shard=None):
    from gh200rt.loader.gguf_file import GGUFFile, stack_name
    from gh200rt.tokenizer.gguf_vocab import tokenizer_from_gguf_metadata
    gguf = GGUFFile(path)
    try:
        arch = ArchConfig.from_gguf_metadata(gguf.metadata, tie_word_embeddings=not gguf.has_output_weight)
        tokenizer = tokenizer_from_gguf_metadata(gguf.metadata)
    except (ValueError, KeyError) as e:
        raise ModelLoadError(f"{path}: {e}") from e
    dtype = compute_dtype(model_config.dtype, compute_device, arch.checkpoint_dtype, model_config.cpu_route)
    model = build_model(arch, dtype, device) if shard is None else build_sharded_model(shard, arch, dtype, device)
    writer = WeightWriter(model, path, len(gguf.tensors), gguf.total_bytes())
    quantized = gguf.read(writer, arch, dtype, shard)
    writer.finish(functools.partial(stack_name, architecture=arch.architecture))
    if shard is not None:
        arch = model.arch      # the rank's heads, KV heads and MLP width
    return model, tokenizer, arch, dtype, writer.bytes_written, quantized


def read_arch(model: str) -> ArchConfig:
    """The architecture of ``model`` (directory, .gguf or alias) without loading its weights."""
    path = resolve_model_path(model)
    if not path.endswith(".gguf"):
        return _arch_from_dir(path)
    from gh200rt.loader.gguf_file import GGUFFile
    gguf = GGUFFile(path)
    try:
        return ArchConfig.from_gguf_metadata(gguf.metadata, tie_word_embeddings=not gguf.has_output_weight)
    except (ValueError, KeyError) as e:
        raise ModelLoadError(f"{path}: {e}") from e


def load_model(model_config, device: str = "cpu", compute_device: str | None = None, shard=None,
               defer_layer_linears: bool = False) -> LoadedModel:
    """Load ``model_config.model`` (directory, .gguf, or alias) in ``model_config.dtype`` onto ``device``;
    ``dtype="auto"`` picks the dtype for ``compute_device`` (default ``device``), where the model will run (on the
    CPU, the dtype of ``model_config.cpu_route``). ``shard`` (a ``distributed.sharding.TensorShard``): load only
    that tensor-parallel rank's slice of the checkpoint (safetensors, FP8 or GGUF); the returned ``arch`` is the rank's.
    ``defer_layer_linears``: a safetensors checkpoint's dense decoder-layer linears are checked but left unread
    (``LoadedModel.deferred``, loader/deferred_layers.py); other checkpoints load whole."""
    start = time.perf_counter()
    path = resolve_model_path(model_config.model)
    with torch.inference_mode():
        if path.endswith(".gguf"):
            loaded = _load_gguf(path, model_config, device, compute_device or device, shard)
        else:
            loaded = _load_hf_dir(path, model_config, device, compute_device or device, shard, defer_layer_linears)
        model, tokenizer, arch, dtype, weight_bytes, quantized, *deferred = loaded
    return LoadedModel(model=model, tokenizer=tokenizer, arch=arch, dtype=dtype, source=path,
                       load_seconds=time.perf_counter() - start, weight_bytes=weight_bytes, quantized=quantized,
                       deferred=deferred[0] if deferred else None)
