"""Host lists to device tensors without stalling the host: one page-locked staging tensor and a
non-blocking copy on a GPU; on the CPU the tensor built from the list is used as it is."""
from __future__ import annotations

import torch


def to_device(data: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.tensor(data)`` on ``device``: through pinned memory and a non-blocking copy on a GPU."""
    if device.type == "cpu":
        return torch.tensor(data, dtype=dtype)
    return torch.tensor(data, dtype=dtype, pin_memory=True).to(device, non_blocking=True)
