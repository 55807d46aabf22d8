"""DecodeGraphRunner: one lazily captured graph per decode batch bucket, recaptured when placement changes.

``run(out)`` pads the step to its bucket, and captures the bucket's graph on first use (or after
``WeightStore.plan_version`` moved: a layer changed tier, so refs, slots and copies differ; the graphs
are dropped and the capture's pool outlives them, see capture.py) inside the
weight store's ``self_contained()`` (no prefetch crosses a graph's boundary), then replays it. Each
capture is counted (``captures``, in ``/metrics``), timed and logged at INFO. On a GPU the ledger books
an estimate of the pool under ``graph_pools`` at start-up (``reserve_graph_pool``, before the KV cache
is sized); a capture whose pool grows past what is booked books the rest, and a bucket whose graph
would over-commit the ledger runs eagerly from then on. The sampler and the logits stay outside the graph.
"""
from __future__ import annotations

import importlib.util
import logging
import time
from dataclasses import dataclass

import torch

from gh200rt.backends.cuda.graph_capture import CapturedStep, make_capture
from gh200rt.engine.decode_graphs.addresses import Addresses, check_addresses, graph_addresses
from gh200rt.engine.decode_graphs.buckets import bucket_for, graph_buckets
from gh200rt.engine.decode_graphs.decode_buffers import DecodeBuffers
from gh200rt.kv import attention as torch_attention
from gh200rt.memory.ledger import LedgerOverCommit
from gh200rt.models.layers.attention import SelfAttention
from gh200rt.planner.cost_model import graph_pool_bytes
from gh200rt.scheduler.scheduler import SchedulerOutput
from gh200rt.weights.schedule import NULL_HOOKS, LayerHooks

log = logging.getLogger(__name__)


@dataclass
class _Graph:
    step: CapturedStep
    addresses: Addresses


def decode_graphs(model, kv_caches, config, max_model_len: int, device: str, store,
                  ledger) -> DecodeGraphRunner | None:
    """The bucketed decode path when the config turns it on for this device (--enforce-eager turns it off)."""
    if not config.use_graphs(torch.device(device).type):
        return None
    missing = graphs_missing(model, device, store)
    if missing:
        log.warning("decode steps run eagerly: CUDA graphs need %s", missing)
        return None
    bs = config.cache.block_size
    buffers = DecodeBuffers(config.max_graph_batch, -(-max_model_len // bs), bs, device)
    return DecodeGraphRunner(model, kv_caches, buffers, graph_buckets(config.max_graph_batch),
                             store or NULL_HOOKS, config.graphs.check_graph_addresses, ledger)


def reserve_graph_pool(ledger, config, arch, dtype: str, device: str) -> None:
    """Book the decode graphs' pool before the KV cache takes what the ledger has left (GPU, graphs on, and a
    model whose steps can be captured: see ``graphs_missing``)."""
    if torch.device(device).type == "cuda" and config.use_graphs("cuda"):
        ledger.reserve("graph_pools", graph_pool_bytes(arch, graph_buckets(config.max_graph_batch), dtype))


def graphs_missing(model, device: torch.device | str, store=None) -> str | None:
    """What this GPU setup lacks for capture (None: nothing): the Triton KV store and attention (the torch ones
    size tensors from data), cuda-bindings where a staging ring copies inside the graph, and for an MoE model
    every layer's experts in the fused kernels (the grouped torch path reads each expert's token count on the
    host; the fused path sorts, aligns and reads the address tables on the device, docs/MOE.md)."""
    if torch.device(device).type != "cuda":
        return None
    if getattr(getattr(model, "arch", None), "is_moe", False):
        missing = _fused_experts_missing(model, torch.device(device))
        if missing:
            return missing
    if any(m.write_kv_fn is torch_attention.write_kv for m in model.modules() if isinstance(m, SelfAttention)):
        return "the Triton KV store and attention kernels (install gh200rt with the triton extra)"
    if getattr(store, "backend", None) is not None and not _has_cuda_bindings():
        return "cuda-bindings to capture the staging copies (install gh200rt with the cuda extra)"
    return None


def _fused_experts_missing(model, device: torch.device) -> str | None:
    from gh200rt.models.moe import SparseMoeBlock
    for module in model.modules():
        if isinstance(module, SparseMoeBlock):
            if module.fused_experts_fn is None:
                return "the fused MoE kernels (install gh200rt with the triton extra)"
            why = module.fused_experts_fn.why_not(module, device)
            if why:
                return f"every MoE layer's experts in the fused kernels, but {why} (docs/MOE.md)"
    return None


def _has_cuda_bindings() -> bool:
    try:
        return importlib.util.find_spec("cuda.bindings") is not None
    except ModuleNotFoundError:
        return False


def rows_of(out: SchedulerOutput) -> int:
    """Rows of a decode step: one per sequence, plus one per drafted token it verifies."""
    return sum(item.num_new_tokens for item in out.scheduled)


class DecodeGraphRunner:
    def __init__(self, model, kv_caches: list[torch.Tensor], buffers: DecodeBuffers, buckets: list[int],
                 hooks: LayerHooks = NULL_HOOKS, check_addresses: bool = False, ledger=None):
        assert buckets and buckets[-1] <= buffers.max_batch, (buckets, buffers.max_batch)
        self.model, self.kv_caches, self.buffers, self.buckets = model, kv_caches, buffers, buckets
        self.hooks, self.check, self.ledger = hooks, check_addresses, ledger
        self.capture = make_capture(buffers.device)
        self.graphs: dict[int, _Graph] = {}
        self.eager_buckets: set[int] = set()
        self.captures = 0
        self.capture_seconds = 0.0
        self.pool_bytes = 0
        self._booked = ledger.by_kind["graph_pools"] if ledger is not None else 0   # reserved at start-up
        self._version = self._plan_version()
        self._scales_pending = True    # --calculate-kv-scales: the first batch must not include padding rows
        # decoder layers whose input hidden states each step also returns (a hidden-state drafter's; set before the
        # first capture): the graph's output is then the final hidden states and those side by side
        self.capture_layers: tuple[int, ...] | None = None

    def handles(self, out: SchedulerOutput) -> bool:
        """Decode only: each sequence computes one token and samples it, or verifies drafts after it (a row per
        position; no prompt logprobs in the step)."""
        bucket = bucket_for(rows_of(out), self.buckets)
        if bucket is None or bucket in self.eager_buckets:
            return False
        if self._scales_pending:
            if any(getattr(m, "calculate_kv_scales", False) for m in self.model.modules()):
                return False
            self._scales_pending = False
        for item in out.scheduled:
            seq = item.seq
            if item.num_new_tokens != 1 + len(item.draft_token_ids) or not item.samples:
                return False
            if seq.params.prompt_logprobs is not None and seq.num_computed_tokens < len(seq.prompt_token_ids):
                return False
        return True

    def run(self, out: SchedulerOutput, fed=None) -> torch.Tensor:
        """Final hidden states ``[B, H]`` of the step's B rows (a row per decoding sequence, one per verified
        position), in scheduled order (``fed``: their input ids on the device, ``run_ahead.FedTokens``); with
        ``capture_layers``, ``[B, H + len(capture_layers) * H]``: the captured layers' inputs after them."""
        batch = rows_of(out)
        bucket = bucket_for(batch, self.buckets)
        assert bucket is not None, (batch, self.buckets)
        version = self._plan_version()
        if version != self._version:
            if self.graphs:
                log.info("weight placement changed: the %d captured decode graphs will be recaptured as used",
                         len(self.graphs))
            self.graphs.clear()
            self.capture.graphs_dropped()
            self._version = version
        self.buffers.fill(out, bucket, fed)
        with self.hooks.self_contained():
            # the staging ring's order and refs as the graph sees them, before a capture records its addresses
            # too (a capture that does not run the step, as on the CPU, would record the last step's order)
            self.hooks.begin_step(bucket)
            graph = self.graphs.get(bucket) or self._capture(bucket)
            if graph is None:       # this step runs its function eagerly on the same buffers
                return self._step(bucket)()[:batch]
            if self.check:
                check_addresses(bucket, graph.addresses, self.addresses())
            hidden = self.capture.replay(graph.step, self.hooks)
        return hidden[:batch]

    def addresses(self) -> Addresses:
        backend = getattr(self.hooks, "backend", None)
        return graph_addresses(self.model, self.kv_caches, self.buffers.tensors(), backend.slots if backend else [])

    def close(self) -> None:
        self.graphs.clear()
        self.capture.close()

    def _plan_version(self) -> int:
        return getattr(self.hooks, "plan_version", 0)

    def _step(self, bucket: int):
        from gh200rt.engine.model_runner import forward, forward_capturing
        ids, positions = self.buffers.input_ids[:bucket], self.buffers.positions[:bucket]
        layers = self.capture_layers

        def step() -> torch.Tensor:
            # fresh metadata each call: what attention derives from it is recomputed from the refilled buffers
            if layers is None:
                return forward(self.model, ids, positions, self.buffers.meta(bucket), self.kv_caches, self.hooks)
            final, captured = forward_capturing(self.model, ids, positions, self.buffers.meta(bucket), self.kv_caches,
                                                layers, self.hooks)
            return torch.cat([final, captured], dim=-1)
        return step

    def _capture(self, bucket: int) -> _Graph | None:
        """Capture ``bucket``'s graph; None when its pool does not fit the ledger (the bucket turns eager)."""
        started = time.perf_counter()
        step = self.capture.capture(self._step(bucket), self.hooks)
        seconds = time.perf_counter() - started
        # booked but not yet used before this capture; a graph dropped for not fitting beside others leaves its
        # blocks in their pool, unbooked, and a later capture that reuses them takes no new device memory
        room = self._booked - (self.capture.pool_bytes - step.pool_bytes)
        beyond = step.pool_bytes - max(0, room)
        if beyond > 0 and self.ledger is not None:
            try:
                self.ledger.reserve("graph_pools", beyond)
                self._booked += beyond
            except LedgerOverCommit as exc:
                log.warning("the decode graph of batch bucket %d does not fit the device memory ledger; that "
                            "bucket runs eagerly from now on (%s)", bucket, exc)
                self.eager_buckets.add(bucket)
                if not self.graphs:     # no graph is left to hold the pool: never capture into its id again
                    self.capture.graphs_dropped()
                return None
        self.pool_bytes = max(self.pool_bytes, self.capture.pool_bytes)
        self.captures += 1
        self.capture_seconds += seconds
        log.info("captured the decode graph of batch bucket %d in %.1f ms (graph pool +%.1f MiB, %.1f MiB in all)",
                 bucket, seconds * 1e3, step.pool_bytes / 2**20, self.pool_bytes / 2**20)
        graph = self.graphs[bucket] = _Graph(step, self.addresses())
        return graph
