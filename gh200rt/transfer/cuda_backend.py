"""CUDA transfer backend: K fixed-address HBM staging slots filled on a dedicated copy stream.

Same contract as ``CpuTransferBackend`` (see ``backend.TransferBackend``), with events instead of
futures and no host synchronisation in ``copy`` / ``wait_copy`` / ``compute_done``:

- ``copy(slot, src)``: on the copy stream, wait until the slot's last reader is done, optionally
  poison the slot (0xFF bytes: NaN in every float dtype), issue a ``non_blocking`` H2D copy from the
  host slab ``src`` and record the slot's "copy done" event. ``src`` must be page-locked (a slab
  passed through ``gh200rt.weights.device_view.prepare_slab_for_device``): a pageable source would
  make the copy synchronous, and is illegal under graph capture.
- ``wait_copy(slot)``: the *current* stream waits on "copy done" (the host does not block).
- ``compute_done(slot)``: records "compute done" on the current stream; the next copy into the slot
  waits on it.

CUDA graphs: the same calls can be captured. ``SlotReleases`` (slot_release.py) decides when a copy
may wait on the slot's "compute done" event and when it must fork from the current stream instead
(an event recorded in another context, or a graph replayed since). Graphs that read staging slots
must be launched through ``replay(graph)`` so eager copies that follow are ordered after the replay's
reads. Each copy is joined back by its ``wait_copy``. Nothing here allocates device memory.

Counters: ``bytes_copied`` counts the copies that were waited for: eager ones as they are issued, and
for a replayed graph the bytes its capture copied, once per replay (graph_copies.py; a capture itself
copies nothing). ``wait_seconds`` is the time the compute stream stood still waiting for copies; it is
measured with CUDA timing events only when ``time_waits`` is True, and stays 0.0 otherwise. Inside
graphs the events are captured as event-record nodes where this torch and driver can (checked once,
``graph_timing_supported``); elsewhere replayed waits are not timed. Reading it with timing on waits
for the timed events to complete (a host sync at read time, never in the hot calls).
"""
from __future__ import annotations

import torch

from gh200rt.transfer.graph_copies import GraphCopies
from gh200rt.transfer.slot_release import SlotReleases

_TIMED_WAITS_KEPT = 1024  # pending timed waits before finished ones are folded in without blocking


def _capture_id(stream: torch.cuda.Stream) -> int | None:
    """Id of the graph capture ``stream`` (the current stream) takes part in; None when not capturing."""
    if not torch.cuda.is_current_stream_capturing():
        return None
    try:
        from cuda.bindings import runtime as rt
    except ImportError as exc:
        raise RuntimeError("capturing streamed layers into a CUDA graph needs cuda-bindings; "
                           "install gh200rt with the cuda extra: pip install 'gh200rt[cuda]'") from exc
    err, _status, capture_id, *_ = rt.cudaStreamGetCaptureInfo(stream.cuda_stream)
    if err != rt.cudaError_t.cudaSuccess:
        raise RuntimeError(f"cudaStreamGetCaptureInfo failed during capture: {err.name}")
    return int(capture_id)


def graph_timing_supported(device: torch.device) -> bool:
    """Whether timing events recorded inside a captured graph time its replays here: tried once on a tiny
    graph of its own (torch's ``Event(external=True)`` makes a captured record an event-record node)."""
    try:
        stream = torch.cuda.Stream(device=device)
        start, end = (torch.cuda.Event(enable_timing=True, external=True) for _ in range(2))
        x = torch.zeros(1, device=device)
        with torch.cuda.stream(stream):
            x.add_(1)
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            start.record()
            x.add_(1)
            end.record()
        graph.replay()
        end.synchronize()
        return start.elapsed_time(end) >= 0.0
    except (TypeError, RuntimeError):
        return False


class CudaTransferBackend:
    def __init__(self, slots: list[torch.Tensor], poison: bool = False, time_waits: bool = False):
        if not slots:
            raise ValueError("CudaTransferBackend needs at least one staging slot")
        device = slots[0].device
        assert all(s.is_cuda and s.device == device and s.dtype == torch.uint8 and s.is_contiguous()
                   for s in slots), "staging slots must be contiguous uint8 tensors on one CUDA device"
        self.slots = slots
        self.poison = poison
        self.time_waits = time_waits
        self.device = device
        self.copy_stream = torch.cuda.Stream(device=device)
        for slot in slots:
            slot.record_stream(self.copy_stream)  # the allocator must not reuse a slot while a copy may still write it
        count = len(slots)
        self._copy_done = [torch.cuda.Event() for _ in range(count)]
        self._compute_done = [torch.cuda.Event() for _ in range(count)]
        self._fork = [torch.cuda.Event() for _ in range(count)]
        self._releases = SlotReleases(count)
        self._pending_bytes: list[int | None] = [None] * count
        self._timed: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._spare_timers: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.bytes_copied = 0
        self._wait_seconds = 0.0
        timed_in_graphs = time_waits and graph_timing_supported(device)
        self._graph_copies = GraphCopies(self._captured_timers if timed_in_graphs else None)

    def copy(self, slot: int, src: torch.Tensor) -> None:
        dst = self.slots[slot]
        assert src.nbytes <= dst.nbytes, (src.nbytes, dst.nbytes)
        assert src.device.type == "cpu" and src.is_contiguous(), "copy sources are contiguous host slabs"
        current = torch.cuda.current_stream(self.device)
        capture = _capture_id(current)
        if capture is None and not src.is_pinned():
            raise ValueError("the host slab given to the CUDA transfer backend is not page-locked; call "
                             "gh200rt.weights.device_view.prepare_slab_for_device(slab, platform) once after "
                             "allocating it")
        if self._releases.can_wait_on_event(slot, capture):
            self.copy_stream.wait_event(self._compute_done[slot])
        else:
            # the slot's last release is not waitable here: order the copy after everything issued so far
            # on the current stream instead (that includes the slot's last reader)
            self._fork[slot].record(current)
            self.copy_stream.wait_event(self._fork[slot])
        with torch.cuda.stream(self.copy_stream):
            if self.poison:
                dst.fill_(0xFF)
            dst[:src.nbytes].copy_(src.reshape(-1).view(torch.uint8), non_blocking=True)
            self._copy_done[slot].record(self.copy_stream)
        self._pending_bytes[slot] = src.nbytes

    def wait_copy(self, slot: int) -> None:
        nbytes = self._pending_bytes[slot]
        assert nbytes is not None, f"slot {slot} was never filled"
        current = torch.cuda.current_stream(self.device)
        capture = _capture_id(current)
        if capture is not None:     # counted per replay of the graph being captured
            timers = self._graph_copies.waited(capture, nbytes)
        else:
            timers = self._timers() if self.time_waits else None
            self.bytes_copied += nbytes
        if timers is not None:
            timers[0].record(current)
        current.wait_event(self._copy_done[slot])
        if timers is not None:
            timers[1].record(current)
            if capture is None:
                self._timed.append(timers)
        self._pending_bytes[slot] = None

    def compute_done(self, slot: int) -> None:
        current = torch.cuda.current_stream(self.device)
        self._compute_done[slot].record(current)
        self._releases.released(slot, _capture_id(current))

    def graph_captured(self, graph: torch.cuda.CUDAGraph) -> None:
        """``graph`` holds the copies captured since its capture began: each replay counts them."""
        self._graph_copies.captured(graph)

    def replay(self, graph: torch.cuda.CUDAGraph) -> None:
        """Launch ``graph`` on the current stream; eager copies after it wait for its reads of the slots."""
        nbytes = self._graph_copies.replay_starts(graph)
        graph.replay()
        self.bytes_copied += nbytes
        self._releases.graph_replayed()

    @property
    def wait_seconds(self) -> float:
        self._fold_timed(block=True)
        return self._wait_seconds + self._graph_copies.read_all()

    def finished_wait_seconds(self) -> float:
        self._fold_timed(block=False)
        return self._wait_seconds + self._graph_copies.read_finished()

    @staticmethod
    def _captured_timers() -> tuple[torch.cuda.Event, torch.cuda.Event]:
        return (torch.cuda.Event(enable_timing=True, external=True),
                torch.cuda.Event(enable_timing=True, external=True))

    def _fold_timed(self, block: bool) -> None:
        done = 0
        for start, end in self._timed:
            if block:
                end.synchronize()
            elif not end.query():
                break
            self._wait_seconds += start.elapsed_time(end) / 1000.0
            done += 1
        self._spare_timers.extend(self._timed[:done])
        del self._timed[:done]

    def _timers(self) -> tuple[torch.cuda.Event, torch.cuda.Event]:
        if len(self._timed) > _TIMED_WAITS_KEPT:
            self._fold_timed(block=False)
        if self._spare_timers:
            return self._spare_timers.pop()
        return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def close(self) -> None:
        """Wait for every copy issued so far (the slots stay allocated until the backend is dropped)."""
        self.copy_stream.synchronize()
