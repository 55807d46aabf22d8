"""What the GPU product benchmarks (``kernel host-gemm``, ``gemv``, ``skinny``) share: Llama-3-8B's linear shapes,
weights moved to pinned host memory, the two bandwidth bounds measured in the run, and the fastest-per-case table."""
from __future__ import annotations

import torch

from gh200rt.bench.rounds import timed

LLAMA3_8B = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
BOUND_BYTES = 1 << 30


def measured_bounds() -> dict[str, float]:
    """GB/s of the two limits: a pinned host -> device copy (the link) and a device copy (HBM, read + write)."""
    host = torch.empty(BOUND_BYTES, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(BOUND_BYTES, dtype=torch.uint8, device="cuda")
    other = torch.empty_like(device)
    link = BOUND_BYTES / timed(lambda: device.copy_(host, non_blocking=True))[0] / 1e6
    hbm = 2 * BOUND_BYTES / timed(lambda: other.copy_(device))[0] / 1e6
    return {"link": link, "hbm": hbm}


def pinned(weight):
    """``weight`` (a device tensor or PackedWeight) in pinned host memory."""
    def move(t: torch.Tensor) -> torch.Tensor:
        return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t)
    if isinstance(weight, torch.Tensor):
        return move(weight)
    return weight.with_tensors({name: move(t) for name, t in weight.tensors().items()})


def print_fastest(rows: list[dict], kernel_width: int) -> None:
    """The fastest row of each (layer, weights, read_from) case: ``kernel gemv``'s and ``kernel skinny``'s last
    table (rows with ``kernel``, ``us`` and ``of_bound``)."""
    print("\nfastest per case")
    best: dict[tuple, dict] = {}
    for row in rows:
        key = (row["layer"], row["weights"], row["read_from"])
        if key not in best or row["us"] < best[key]["us"]:
            best[key] = row
    for (layer, weights, where), row in best.items():
        print(f"{layer:<8} {weights:<5} {where:<20} {row['kernel']:<{kernel_width}} {row['us']:9.1f} us "
              f"{row['of_bound']:5.2f} of bound")
