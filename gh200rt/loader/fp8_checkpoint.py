"""FP8 checkpoints in the Hugging Face layout: each quantized linear stores ``weight`` as float8_e4m3fn
``[N, K]`` and ``weight_scale`` (one float32 per tensor or per output channel), plus an
``input_scale`` for static activation quantization, which gh200rt ignores (activations stay in the
compute dtype). ``config.json`` describes it in ``quantization_config``:

- ``quant_method: "fp8"`` (vLLM / transformers FP8) without ``weight_block_size``;
- ``quant_method: "compressed-tensors"`` whose groups quantize weights to 8-bit floats with strategy
  ``tensor`` or ``channel`` (the common Llama-3.1-*-Instruct-FP8 checkpoints);
- ``quant_method: "fbgemm_fp8"`` (per-channel weight scales).

Block-wise scales (``weight_block_size``, strategy ``block``), other bit widths and other methods
are refused with an error that says so. The loader writes each fp8 weight dequantized (``weight x
scale``) into the model in its compute dtype (what the CPU computes with) and keeps the fp8 form
(``PackedWeight`` fmt ``fp8``, bit for bit) for the placement: offloaded layers store it as their host
form, and resident layers on a GPU keep it instead of the dense copy. K/V cache scales a checkpoint
carries (``self_attn.k_scale`` / ``v_scale``, or compressed-tensors' ``k_proj.output_scale`` /
``v_proj.output_scale``) become the layers' fp8 KV scales.

A tensor-parallel rank reads a slice of each weight (``slices``, from ``TensorShard.checkpoint_slices``): rows
(column-parallel) take the same rows of a per-channel scale, columns (row-parallel, o/down) keep every scale (one
per output row); a per-tensor scale is replicated. The slice's fp8 bytes and scales are those of the whole
weight, so each rank computes with exactly the rows and columns TP=1 would.
"""
from __future__ import annotations

import torch

from gh200rt.formats.pack import PackedWeight
from gh200rt.formats.quantizers import fp8_from_checkpoint
from gh200rt.loader.errors import ModelLoadError

SUPPORTED = "quant_method fp8 (no weight_block_size), compressed-tensors (8-bit float weights, strategy tensor or " \
            "channel) or fbgemm_fp8"
_SCALE_SUFFIXES = (".weight_scale", ".input_scale", ".input_scale_ub")
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
        if quant.get("weight_block_size"):
            raise ModelLoadError(f"{source}: block-wise FP8 scales (weight_block_size {quant['weight_block_size']}) "
                                 f"are not supported; gh200rt reads {SUPPORTED}: use a per-tensor or per-channel FP8 "
                                 "checkpoint of this model, or its bf16 original")
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


class Fp8Weights:
    """Turns the tensors of an FP8 checkpoint into what the model and the placement need (see module doc).

    ``scales`` are every ``weight_scale`` in the checkpoint, read before the weights (they may sit in
    another shard than their weight)."""

    def __init__(self, scales: dict[str, torch.Tensor], source: str,
                 slices: dict[str, tuple[int, int, int]] | None = None):
        self.scales, self.source, self.slices = scales, source, slices or {}
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
        used = {n[:-len("weight")] + "weight_scale" for n in self.packed}
        return sorted(set(self.scales) - used)

    def apply_kv_scales(self, model) -> None:
        from gh200rt.models.layers.attention import SelfAttention
        layers = [m for m in model.modules() if isinstance(m, SelfAttention)]
        for name, value in self.kv_scales.items():
            index = int(name.split("model.layers.")[1].split(".")[0])
            which = next(v for s, v in _KV_SCALES.items() if name.endswith(s))
            layers[index].kv_scale[which] = value
