"""Tiny checkpoints rewritten in DeepSeek's block-FP8 layout: every decoder linear's ``weight`` as float8_e4m3fn and
a float32 ``weight_scale_inv`` per block of ``block`` rows x columns (``weight = fp8 x scale_inv`` in each block),
``quantization_config`` ``{"quant_method": "fp8", "weight_block_size": [rows, cols]}``; and the dequantized twin."""
from __future__ import annotations

import json
import os

import torch
from safetensors.torch import load_file, save_file

# DeepSeek-V3 keeps its router, norms, embeddings and head in bf16: only these linears are fp8
BLOCK_LINEARS = ("q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "k_proj", "v_proj", "o_proj",
                 "gate_proj", "up_proj", "down_proj")


def quantize_blocks(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 codes [N, K], float32 scale_inv [ceil(N/bn), ceil(K/bk)]): each block scaled to its largest magnitude."""
    n, k = w.shape
    bn, bk = block
    rows, cols = -(-n // bn), -(-k // bk)
    padded = torch.zeros(rows * bn, cols * bk)
    padded[:n, :k] = w.float()
    tiles = padded.view(rows, bn, cols, bk)
    amax = tiles.abs().amax(dim=(1, 3)).clamp(min=1e-12)
    scale_inv = amax / 448.0
    codes = (tiles / scale_inv[:, None, :, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return codes.view(rows * bn, cols * bk)[:n, :k].contiguous(), scale_inv


def dequantize_blocks(codes: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    n, k = codes.shape
    bn, bk = block
    return codes.float() * scale_inv.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]


def to_fp8_block_checkpoint(path: str, block: tuple[int, int] = (16, 16), twin: str | None = None) -> list[str]:
    """Rewrite the safetensors checkpoint in ``path`` in the block-FP8 layout; with ``twin``, write beside it a copy of
    the directory whose weights are the dequantized values (float32). Returns the names quantized."""
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    dequantized = dict(tensors)
    names = [n for n in tensors if n.endswith(".weight") and n.split(".")[-2] in BLOCK_LINEARS]
    for name in names:
        codes, scale_inv = quantize_blocks(tensors[name], block)
        tensors[name] = codes
        tensors[name[:-len("weight")] + "weight_scale_inv"] = scale_inv
        dequantized[name] = dequantize_blocks(codes, scale_inv, block)
    save_file(tensors, file, metadata={"format": "pt"})
    config_path = os.path.join(path, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    if twin is not None:
        import shutil
        shutil.copytree(path, twin)
        save_file(dequantized, os.path.join(twin, "model.safetensors"), metadata={"format": "pt"})
    config["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                     "weight_block_size": list(block)}
    with open(config_path, "w") as f:
        json.dump(config, f)
    return names
