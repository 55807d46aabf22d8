"""CPU transfer backend: one copy worker thread; futures stand in for CUDA events.

Contract: ``copy(slot, src)`` queues ``dst[slot].copy_(src)`` behind any pending copies and
after the slot's last "compute done"; ``wait_copy(slot)`` blocks the compute side until that copy
is finished (the blocked time is counted); ``compute_done(slot)`` marks the slot free for reuse.
With ``poison=True`` the slot is filled with NaN bytes before each copy, so a read before the
copy lands shows up as NaN in the output.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch


class CpuTransferBackend:
    def __init__(self, slots: list[torch.Tensor], poison: bool = False):
        self.slots = slots
        self.poison = poison
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gh200rt-copy")
        self._copy_done: list[Future | None] = [None] * len(slots)
        self._compute_done = [threading.Event() for _ in slots]
        for event in self._compute_done:
            event.set()
        self.bytes_copied = 0
        self.wait_seconds = 0.0

    def copy(self, slot: int, src: torch.Tensor) -> None:
        dst = self.slots[slot]
        assert src.nbytes <= dst.nbytes, (src.nbytes, dst.nbytes)
        free_event = self._compute_done[slot]
        if self.poison:
            # poison on the compute side, once the slot's last reader is done, so it is visible
            # to any read that races ahead of the copy below
            free_event.wait()
            dst.view(torch.uint8).fill_(0xFF)
        free_event.clear()

        def run():
            dst.view(torch.uint8)[: src.nbytes].copy_(src.reshape(-1).view(torch.uint8))
            return src.nbytes

        self._copy_done[slot] = self._worker.submit(run)

    def wait_copy(self, slot: int) -> None:
        future = self._copy_done[slot]
        assert future is not None, f"slot {slot} was never filled"
        start = time.perf_counter()
        self.bytes_copied += future.result()
        self.wait_seconds += time.perf_counter() - start
        self._copy_done[slot] = None

    def finished_wait_seconds(self) -> float:
        return self.wait_seconds     # the host blocked in each wait: every wait counted has finished

    def compute_done(self, slot: int) -> None:
        self._compute_done[slot].set()

    def graph_captured(self, graph) -> None:
        """Nothing to file: replaying a CPU step runs its copies and waits again, which count themselves."""

    def replay(self, graph) -> None:
        """Run a recorded step (``graph.replay()``); the host runs it in order, so nothing more to track."""
        graph.replay()

    def close(self) -> None:
        self._worker.shutdown(wait=True)
