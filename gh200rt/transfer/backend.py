"""The transfer backend interface and the factory that picks the CPU or CUDA implementation.

A backend owns K fixed-address staging slots (``slots[i]``: uint8, ``slot_bytes`` each, allocated
once) and fills them from host slabs ahead of use. Per slot, "copy done" orders the copy before
the compute that reads the slot, and "compute done" orders that compute before the next copy
overwrites it. The CPU backend does this with a copy thread and futures (the host blocks in
``wait_copy``); the CUDA backend with a copy stream and events (nothing blocks the host, and the
calls can be captured into a CUDA graph).
"""
from __future__ import annotations

from typing import Protocol

import torch

from gh200rt.transfer.cpu_backend import CpuTransferBackend


class TransferBackend(Protocol):
    slots: list[torch.Tensor]
    bytes_copied: int       # bytes of the copies waited for so far
    wait_seconds: float     # time compute stood still waiting for copies (see each backend)

    def finished_wait_seconds(self) -> float:
        """``wait_seconds`` of the waits the device has finished, without waiting for the rest (the step in flight
        with async scheduling): what the tier controller reads between steps."""

    def copy(self, slot: int, src: torch.Tensor) -> None:
        """Fill ``slots[slot][:src.nbytes]`` from the host slab ``src``, once the slot's last reader is done."""

    def wait_copy(self, slot: int) -> None:
        """Make the compute that follows wait until the slot's last ``copy`` has landed."""

    def compute_done(self, slot: int) -> None:
        """Mark the compute issued so far as the slot's last reader: the next ``copy`` may overwrite it."""

    def graph_captured(self, graph) -> None:
        """``graph`` was just captured: the copies captured into it are counted on each of its replays."""

    def replay(self, graph) -> None:
        """Launch a captured step (``graph.replay()``) so that later copies are ordered after its reads."""

    def close(self) -> None:
        """Finish outstanding copies and release the copy worker."""


def make_transfer_backend(device, slot_bytes: int, num_slots: int, poison: bool) -> TransferBackend:
    """``num_slots`` staging slots of ``slot_bytes`` on ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:1"``...).

    ``poison`` fills a slot with 0xFF bytes (NaN in every float dtype) before each copy, so a read
    that races ahead of its copy shows up in the output.
    """
    device = torch.device(device)
    if not isinstance(slot_bytes, int) or slot_bytes <= 0:
        raise ValueError(f"staging slots need a positive byte size, got {slot_bytes!r}")
    if not isinstance(num_slots, int) or num_slots <= 0:
        raise ValueError(f"the staging ring needs at least one slot, got {num_slots!r} (--staging-slots)")
    if device.type == "cpu":
        return CpuTransferBackend([torch.empty(slot_bytes, dtype=torch.uint8) for _ in range(num_slots)],
                                  poison=poison)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"a CUDA transfer backend was asked for ({device}) but torch sees no CUDA device; "
                               f"run on a GPU host with a CUDA build of torch, or use the cpu platform")
        from gh200rt.transfer.cuda_backend import CudaTransferBackend
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        slots = [torch.empty(slot_bytes, dtype=torch.uint8, device=device) for _ in range(num_slots)]
        # waits are timed with CUDA events (eager steps; replays run no Python), so copy_wait_seconds_total
        # is real on GPUs too; reading it syncs only on events of steps whose tokens were already read
        return CudaTransferBackend(slots, poison=poison, time_waits=True)
    raise ValueError(f"no transfer backend for device {device}; gh200rt runs on cpu or cuda")
