"""FP8 checkpoints in the Hugging Face layout: each quantized linear stores ``weight`` as float8_e4m3fn ``[N, K]``
and its scales, plus an ``input_scale`` for static activation quantization, which gh200rt ignores (activations stay
in the compute dtype). ``config.json`` describes it in ``quantization_config``:

- ``quant_method: "fp8"`` (vLLM / transformers FP8) without ``weight_block_size``: ``weight_scale``, one float32 per
  tensor or per output channel;
- ``quant_method: "fp8"`` with ``weight_block_size`` [rows, columns] (DeepSeek-V3's and Qwen3's FP8 releases):
  ``weight_scale_inv``, one float32 multiplier per block (``fp8_blocks_from_checkpoint``);
- ``quant_method: "compressed-tensors"`` whose groups quantize weights to 8-bit floats with strategy
  ``tensor`` or ``channel`` (the common Llama-3.1-*-Instruct-FP8 checkpoints);
- ``quant_method: "fbgemm_fp8"`` (per-channel weight scales).

compressed-tensors' block strategy, other bit widths and other methods are refused with an error that says so.
The loader writes each fp8 weight dequantized (``weight x scale``) into the model in its compute dtype (what the
CPU computes with), one tensor at a time, and keeps the fp8 form (``PackedWeight`` fmt ``fp8``, bit for bit) for
the placement: offloaded layers store it as their host form, and resident layers on a GPU keep it instead of the
dense copy. K/V cache scales a checkpoint carries (``self_attn.k_scale`` / ``v_scale``, or compressed-tensors'
``k_proj.output_scale`` / ``v_proj.output_scale``) become the layers' fp8 KV scales.

A tensor-parallel rank reads a slice of each weight (``slices``, from ``TensorShard.checkpoint_slices``): rows
(column-parallel) take the same rows of a per-channel scale, columns (row-parallel, o/down) keep every scale (one
per output row); a per-tensor scale is replicated; a block scale is sliced by whole blocks (a slice that does not
start on a block boundary is refused). The slice's fp8 bytes and scales are those of the whole
weight, so each rank computes with exactly the rows and columns TP=1 would.
"""
from __future__ import annotations

import torch

from gh200rt.formats.pack import PackedWeight
from gh200rt.formats.quantizers import fp8_blocks_from_checkpoint, fp8_from_checkpoint
from gh200rt.loader.errors import ModelLoadError

SUPPORTED = "quant_method fp8 (per tensor, per channel or in weight_block_size blocks), compressed-tensors (8-bit " \
            "float weights, strategy tensor or channel) or fbgemm_fp8"
_SCALE_SUFFIXES = (".weight_scale", ".weight_scale_inv", ".input_scale", ".input_scale_ub")
_KV_SCALES = {"self_attn.k_scale": 0, "self_attn.v_scale": 1,
              "self_attn.k_proj.output_scale": 0, "self_attn.v_proj.output_scale": 1}


def fp8_scheme(config: dict, source: str) -> bool:
    """Whether ``config.json``'s ``quantization_config`` describes a supported FP8 checkpoint (False when there
    is none); any other quantization raises ``ModelLoadError`` naming it."""
    quant = config.get("quantization_config")
    if not quant:
        return False
    method = quant.get("quant_method")
    if method == "fp8":
        block = quant.get("weight_block_size")
        if block is not None and not (isinstance(block, (list, tuple)) and len(block) == 2
                                      and all(isinstance(b, int) and b > 0 for b in block)):
            raise ModelLoadError(f"{source}: quantization_config weight_block_size {block!r} is not two positive "
                                 "integers [rows, columns]")
        return True
    if method == "fbgemm_fp8":
        return True
    if method == "compressed-tensors":
        for name, group in (quant.get("config_groups") or {}).items():
            weights = group.get("weights") or {}
            if weights.get("num_bits") != 8 or weights.get("type") != "float" \
                    or weights.get("strategy") not in ("tensor", "channel"):
                raise ModelLoadError(
                    f"{source}: compressed-tensors group {name!r} quantizes weights as {weights.get('num_bits')}-bit "
                    f"{weights.get('type')} with strategy {weights.get('strategy')!r}; gh200rt reads {SUPPORTED}")
        return True
    raise ModelLoadError(f"{source}: quantization_config quant_method {method!r} is not supported; gh200rt reads "
                         f"{SUPPORTED} checkpoints, GGUF files and unquantized checkpoints")


def fp8_block_size(config: dict) -> tuple[int, int] | None:
    """The ``weight_block_size`` (rows, columns) of a block-FP8 checkpoint's ``config.json``, else None."""
    quant = config.get("quantization_config") or {}
    block = quant.get("weight_block_size") if quant.get("quant_method") == "fp8" else None
    return (int(block[0]), int(block[1])) if block else None


class Fp8Weights:
    """Turns the tensors of an FP8 checkpoint into what the model and the placement need (see module doc).

    ``scales`` are every ``weight_scale`` in the checkpoint, read before the weights (they may sit in
    another shard than their weight)."""

    def __init__(self, scales: dict[str, torch.Tensor], source: str,
                 slices: dict[str, tuple[int, int, int]] | None = None, block: tuple[int, int] | None = None):
        """``block``: a block-FP8 checkpoint's (rows, columns) per scale."""
        self.scales, self.source, self.slices, self.block = scales, source, slices or {}, block
        self.packed: dict[str, PackedWeight] = {}
        self.kv_scales: dict[str, float] = {}

    @staticmethod
    def is_weight_scale(name: str) -> bool:
        return name.endswith(_SCALE_SUFFIXES)

    @staticmethod
    def is_kv_scale(name: str) -> bool:
        return name.endswith(tuple(_KV_SCALES))

    def dense(self, name: str, tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The tensor to write for checkpoint entry ``name``: an fp8 weight dequantized, others as they are."""
        if tensor.dtype != torch.float8_e4m3fn:
            return tensor.to(dtype)
        if self.block is not None:
            self.packed[name] = packed = self._blocks(name, tensor)
            return packed.dequantize().to(dtype)
        scale_name = name[:-len("weight")] + "weight_scale"
        if not name.endswith(".weight") or scale_name not in self.scales:
            raise ModelLoadError(f"{self.source}: {name} is stored as float8_e4m3fn but the checkpoint has no "
                                 f"{scale_name} for it; the checkpoint is incomplete")
        try:
            packed = fp8_from_checkpoint(tensor, self._scale(name, self.scales[scale_name]))
        except ValueError as e:
            raise ModelLoadError(f"{self.source}: {name}: {e} (block-wise scales are not supported)") from e
        self.packed[name] = packed
        return packed.dequantize().to(dtype)

    def _blocks(self, name: str, tensor: torch.Tensor) -> PackedWeight:
        rows, cols = self.block
        scale_name = name[:-len("weight")] + "weight_scale_inv"
        if not name.endswith(".weight") or scale_name not in self.scales:
            raise ModelLoadError(f"{self.source}: {name} is stored as float8_e4m3fn in blocks of {rows}x{cols} but the "
                                 f"checkpoint has no {scale_name} for it; the checkpoint is incomplete")
        scale = self.scales[scale_name]
        part = self.slices.get(name)
        if part is not None:
            dim, start, stop = part
            size = (rows, cols)[dim]
            if start % size:
                where = "row" if dim == 0 else "column"
                raise ModelLoadError(f"{self.source}: {name}: this rank's slice starts at {where} {start}, inside a "
                                     f"{rows}x{cols} scale block; choose a --tensor-parallel-size whose shards start "
                                     f"on multiples of {size}")
            scale = scale.narrow(dim, start // size, -(-stop // size) - start // size)
        try:
            return fp8_blocks_from_checkpoint(tensor, scale, self.block)
        except ValueError as e:
            raise ModelLoadError(f"{self.source}: {name}: {e}; {scale_name} does not match its weight (the checkpoint "
                                 "is malformed, or config.json's weight_block_size is not the one it was saved with)"
                                 ) from e

    def _scale(self, name: str, scale: torch.Tensor) -> torch.Tensor:
        """``name``'s scale for the slice of it this rank read: a per-channel scale's rows where the rows are sliced."""
        part = self.slices.get(name)
        if part is None or part[0] != 0 or scale.numel() == 1:
            return scale
        _, start, stop = part
        return scale.reshape(-1)[start:stop]

    def note_kv_scale(self, name: str, tensor: torch.Tensor) -> None:
        if tensor.numel() != 1:
            raise ModelLoadError(f"{self.source}: {name} holds {tensor.numel()} values; gh200rt reads one K and one V "
                                 "scale per layer")
        self.kv_scales[name] = float(tensor.float().reshape(()).item())

    def unused_scales(self) -> list[str]:
        """``weight_scale`` entries whose weight was not stored as fp8 (the checkpoint is malformed)."""
        suffix = "weight_scale" if self.block is None else "weight_scale_inv"
        used = {n[:-len("weight")] + suffix for n in self.packed}
        return sorted(set(self.scales) - used)

    def apply_kv_scales(self, model) -> None:
        from gh200rt.models.layers.attention import SelfAttention
        layers = [m for m in model.modules() if isinstance(m, SelfAttention)]
        for name, value in self.kv_scales.items():
            index = int(name.split("model.layers.")[1].split(".")[0])
            which = next(v for s, v in _KV_SCALES.items() if name.endswith(s))
            layers[index].kv_scale[which] = value
