"""Capturing and replaying one bucket's decode step: the only CUDA-specific part of the graph path.

``CpuCapture`` stands in on the CPU: the "graph" is the step function, and replaying it calls the
function again on the same persistent buffers (so everything but the capture is exercised there).
``CudaCapture`` warms the step up and captures it on one side stream of its own (so whatever the step
allocates lazily, a cuBLAS workspace for that stream above all, is allocated by the warm-up, outside the
graph's pool), with ``torch.cuda.CUDAGraph``, into one memory pool that all buckets share: graphs are
replayed one at a time on one stream and every captured output stays referenced, so no graph's memory
aliases another's live output. Streamed layers' staging copies are captured as nodes on the transfer
backend's copy stream (it forks from and joins the capturing stream); replays go through the weight
store's ``replay`` so the backend knows a graph read its slots.

A pool id is never captured into again once its graphs are gone. A ``graph_pool_handle()`` is only an id:
once the last graph captured into it is dropped (a tier move drops them all) the allocator counts no user
of the pool, yet a block still allocated in it keeps the pool alive, and the next capture into that id
fails the allocator's ``use_count > 0`` assertion and aborts the process. So each generation of graphs
gets a fresh handle (``graphs_dropped``); the old pool's blocks go back to the device as they are freed.
(A ``torch.cuda.MemPool`` kept alive would also count as a user, but some torch releases assert in its
destructor that no graph still uses it, which an unlucky teardown order turns into an abort.)
``pool_bytes`` is what the current generation's captures added to the allocator's reserved memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

Step = Callable[[], torch.Tensor]

WARMUP_RUNS = 2    # lets lazily initialised state (cuBLAS workspaces, Triton's compiled kernels) settle


@dataclass
class CapturedStep:
    graph: object                  # torch.cuda.CUDAGraph, or the step function on the CPU
    output: torch.Tensor | None    # the graph's output buffer (CUDA); None on the CPU
    pool_bytes: int


class CpuCapture:
    pool_bytes = 0

    def capture(self, step: Step, hooks=None) -> CapturedStep:
        return CapturedStep(step, None, 0)

    def replay(self, captured: CapturedStep, hooks) -> torch.Tensor:
        return captured.graph()

    def graphs_dropped(self) -> None:
        pass

    def close(self) -> None:
        pass


# Warm-up and capture run on one side stream per device for the whole process, as torch.cuda.graph's own default
# does: cuBLAS keeps a workspace (32 MiB on Hopper) for every stream it ran on until the process exits, so a stream
# per engine left 32 MiB allocated behind every engine closed (measured on an H200, docs/gpu-runs/h200-2026-11-29).
_CAPTURE_STREAMS: dict[int, torch.cuda.Stream] = {}


def capture_stream(device: torch.device) -> torch.cuda.Stream:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[index] = torch.cuda.Stream(device=index)
    return _CAPTURE_STREAMS[index]


class CudaCapture:
    def __init__(self, device: torch.device):
        self.device = device
        self.stream = capture_stream(device)
        self.pool_bytes = 0
        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, step: Step, hooks) -> CapturedStep:
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            for _ in range(WARMUP_RUNS):
                step()
        current.wait_stream(self.stream)
        # torch.cuda.graph empties the cache on entry: do it first, so the growth measured is the pool's
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            output = step()
        hooks.graph_captured(graph)
        grown = max(0, torch.cuda.memory_reserved(self.device) - before)
        self.pool_bytes += grown
        return CapturedStep(graph, output, grown)

    def replay(self, captured: CapturedStep, hooks) -> torch.Tensor:
        hooks.replay(captured.graph)
        return captured.output

    def graphs_dropped(self) -> None:
        """Every graph captured so far is gone (a tier move): the next generation captures into a fresh pool."""
        self.pool = torch.cuda.graph_pool_handle()
        self.pool_bytes = 0    # the old pool's blocks go back to the device as their tensors die

    def close(self) -> None:
        pass


def make_capture(device: torch.device | str):
    device = torch.device(device)
    return CudaCapture(device) if device.type == "cuda" else CpuCapture()
