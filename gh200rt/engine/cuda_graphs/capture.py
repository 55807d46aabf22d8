"""Capturing and replaying one bucket's decode step: the only CUDA-specific part of the graph path.

``CpuCapture`` stands in on the CPU: the "graph" is the step function, and replaying it calls the
function again on the same persistent buffers (so everything but the capture is exercised there).
``CudaCapture`` warms the step up on a side stream, then captures it with ``torch.cuda.CUDAGraph``
into one memory pool (``torch.cuda.graph_pool_handle``) that all buckets share: graphs are replayed
one at a time on one stream and every captured output stays referenced, so no graph's memory
aliases another's live output. Streamed layers' staging copies are captured as nodes on the
transfer backend's copy stream (it forks from and joins the capturing stream); replays go through
the weight store's ``replay`` so the backend knows a graph read its slots. ``pool_bytes`` is what
the capture added to the allocator's reserved memory (the ledger books it).
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
    def capture(self, step: Step) -> CapturedStep:
        return CapturedStep(step, None, 0)

    def replay(self, captured: CapturedStep, hooks) -> torch.Tensor:
        return captured.graph()


class CudaCapture:
    def __init__(self, device: torch.device):
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, step: Step) -> CapturedStep:
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                step()
        current.wait_stream(side)
        # torch.cuda.graph empties the cache on entry: do it first, so the growth measured is the pool's
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            output = step()
        return CapturedStep(graph, output, max(0, torch.cuda.memory_reserved(self.device) - before))

    def replay(self, captured: CapturedStep, hooks) -> torch.Tensor:
        hooks.replay(captured.graph)
        return captured.output


def make_capture(device: torch.device | str):
    device = torch.device(device)
    return CudaCapture(device) if device.type == "cuda" else CpuCapture()
