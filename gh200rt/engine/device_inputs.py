"""Host lists to device tensors, and device results back to the host, without stalling the host: one
page-locked staging tensor and a non-blocking copy on a GPU; on the CPU the tensor is used as it is."""
from __future__ import annotations

import numpy as np
import torch


def to_device(data: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.tensor(data)`` on ``device``: through pinned memory and a non-blocking copy on a GPU."""
    if device.type == "cpu":
        return torch.tensor(data, dtype=dtype)
    return torch.tensor(data, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


def array_to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A copy of ``array`` on ``device`` (never sharing its memory, as ``torch.tensor`` does not): through pinned
    memory and a non-blocking copy on a GPU."""
    host = torch.from_numpy(np.ascontiguousarray(array))
    if device.type == "cpu":
        return host.clone()
    return host.pin_memory().to(device, non_blocking=True)


def to_host(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """``tensor`` on its way to the host: a page-locked copy made in stream order without waiting for it, and the
    event to synchronize before reading it (None on the CPU, where the tensor itself is returned). Work launched
    after this call does not delay the copy's landing, as a ``tolist()`` issued later would."""
    if tensor.device.type == "cpu":
        return tensor, None
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    landed = torch.cuda.Event()
    landed.record()
    return host, landed
