"""The ``cpu`` expert tier: routed experts computed by the host's cores, in the host memory they live in.

A cpu-tier expert keeps only its host form (the layer's expert slab, any host format); a step that routes few tokens
to it sends those tokens' rows to the host, where ``CpuExpertPool``'s worker runs the expert's MLP with the CPU
platform's own kernels, while the device computes the layer's other experts and its shared expert; the outputs come
back before the layer's weighted sum (``models/layers/moe_experts.ExpertRun``). A step that routes more pairs to it
than the plan's ``cpu_expert_max_tokens`` (Fiddler's rule from the profile's figures, planner/cost_model.py; a
prefill) computes it on the device instead, read as an offloaded expert is there (in place on GH200 and on the CPU
platform, streamed on a PCIe GPU): the weights are read once either way, and the device's arithmetic is the faster
for many tokens.

The pool is one worker thread: the step's host experts run one after another, each linear spread over ``threads``
threads by the native kernels (OpenMP) and torch's intra-op pool, on the CPUs nearest the GPU (the worker inherits the
engine's binding, ``--bind-threads``). On the CPU platform the "device" is the same cores: the mechanism runs exactly
as on a GPU host, the two sides sharing them. ``HostExpertMLP`` is the expert's MLP on the host: a GatedMLP whose
weights are the slab's host forms and whose hooks are the CPU backend's ops (``install``), so a cpu expert on the CPU
platform computes with the bits a direct one does.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from gh200rt.models.layers.mlp import GatedMLP


class HostExpertMLP:
    """One MoE layer's expert MLP on the host (a meta-device GatedMLP whose refs point at one expert's host weights
    for each call: the pool's single worker is its only user)."""

    def __init__(self, hidden_size: int, intermediate_size: int, dtype: torch.dtype, install):
        self.hidden_size, self.dtype = hidden_size, dtype
        self.mlp = GatedMLP(hidden_size, intermediate_size, dtype, "meta")
        install(self.mlp)

    def check(self, weights: dict[str, object], what: str) -> None:
        """Multiply one zero row through ``weights`` now: a host form the CPU kernels cannot multiply fails at
        start-up, saying so, not in a request's step."""
        rows = torch.zeros(1, self.hidden_size, dtype=self.dtype)
        try:
            with torch.inference_mode():
                self(weights, rows, None)
        except Exception as exc:
            raise ValueError(f"the cpu expert tier cannot compute {what} in its host form on this host's cores "
                             f"({type(exc).__name__}: {exc}); choose another --host-weight-dtype, or place those "
                             f"experts on another tier (--moe-expert-tier direct / stream)") from exc

    def __call__(self, weights: dict[str, object], rows: torch.Tensor, block_rows: int | None) -> torch.Tensor:
        for name, ref in self.mlp.weight_refs().items():
            ref.current = weights[name]
        try:
            return self.mlp(rows, block_rows)
        finally:
            for ref in self.mlp.weight_refs().values():
                ref.current = None


class HostJob:
    """A step's host experts of one layer in flight; ``result()`` waits and returns their outputs on ``device``."""

    def __init__(self, future: Future, device: torch.device):
        self.future, self.device = future, device

    def result(self) -> torch.Tensor:
        out = self.future.result()
        return out if out.device == self.device else out.to(self.device)


class CpuExpertPool:
    """The worker that computes cpu-tier experts (``threads`` threads per linear). ``install(mlp)`` points a host
    MLP's hooks at the CPU backend's ops."""

    def __init__(self, threads: int, install):
        self.threads, self.install = threads, install
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gh200rt-cpu-experts",
                                            initializer=self._init_worker)
        self._mlps: dict[tuple, HostExpertMLP] = {}
        self._lock = threading.Lock()
        self.closed = False

    def _init_worker(self) -> None:
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)     # this thread's OpenMP team (and later threads' default)

    def mlp_for(self, hidden_size: int, intermediate_size: int, dtype: torch.dtype) -> HostExpertMLP:
        key = (hidden_size, intermediate_size, dtype)
        with self._lock:
            if key not in self._mlps:
                self._mlps[key] = HostExpertMLP(hidden_size, intermediate_size, dtype, self.install)
            return self._mlps[key]

    def submit(self, mlp: HostExpertMLP, weights: list[dict[str, object]], rows: torch.Tensor, counts: list[int],
               block_rows: int | None) -> HostJob:
        """Compute expert after expert (``weights[j]`` over the next ``counts[j]`` of ``rows``) on the worker."""
        if self.closed:
            raise RuntimeError("this engine's cpu expert pool was closed with it; build a new engine")
        device = rows.device
        host_rows = rows if rows.device.type == "cpu" else rows.to("cpu")

        def run() -> torch.Tensor:
            with torch.inference_mode():
                outs = [mlp(w, part, block_rows) for w, part in zip(weights, host_rows.split(counts), strict=True)]
                return torch.cat(outs) if len(outs) > 1 else outs[0]
        return HostJob(self._executor.submit(run), device)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._executor.shutdown(wait=True)
