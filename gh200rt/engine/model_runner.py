"""Flatten one scheduled step into model inputs, run the model, return the logits that are needed.

Only rows that sample (the last token of a sequence that completes its prompt or decodes) go
through ``compute_logits``, plus every prompt position of sequences that asked for
``prompt_logprobs``; an embedding sequence's pooled rows (``engine/pooling.py``) come back summed instead. Inputs are built from host lists in one pass (no per-token tensors) and reach
the device in one copy (through pinned memory on a GPU), so preparing a step never waits on it. A sequence that
verifies drafted tokens (speculative decoding) enters as one decode row per position, every row sampling.
The runner drives the weight store's hooks around every decoder layer (``forward``): the staging
ring waits for and prefetches weights there, while the model itself stays pure. Decode-only steps go
through ``graphs`` (a ``DecodeGraphRunner``: bucketed, padded, replayed from CUDA graphs) when given. On the
CPU a step that computes prompt positions (every step with ``batch_invariant``) runs its linears and logits head
in fixed row blocks instead (``engine/invariance.py``), so a row's bits do not depend on the rows beside it.
With LoRA, ``lora`` (the engine's ``AdapterRegistry``) puts the step's adapters in their device slots and sets the
step's per-token slots before the model runs, and clears them after. With a host KV tier, ``host_loads`` gives the
step's loads before the model runs, and each decoder layer's share is made ready just before it (``LoadingLayers``,
kv/layered_load.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from gh200rt.engine.device_inputs import array_to_device
from gh200rt.engine.invariance import LOGIT_BLOCK_ROWS, LOGIT_MAX_BLOCK_ROWS, linear_block_rows
from gh200rt.engine.layer_times import LayerTimes
from gh200rt.engine.pooling import pool_rows
from gh200rt.kv.block_row import block_row
from gh200rt.kv.layered_load import LayeredLoad
from gh200rt.models.base import AttentionMetadata
from gh200rt.models.layers.row_blocks import RowBlockSizes, in_row_blocks
from gh200rt.scheduler.scheduler import SchedulerOutput
from gh200rt.weights.schedule import NULL_HOOKS, ForwardingHooks, LayerHooks


def forward(model, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
            kv_caches: list[torch.Tensor], hooks: LayerHooks = NULL_HOOKS) -> torch.Tensor:
    """``model(input_ids, positions, meta, kv_caches)`` with ``hooks`` called around every decoder layer
    (without hooks, any model that follows the contract's ``forward`` runs as it is)."""
    if hooks is NULL_HOOKS:
        return model(input_ids, positions, meta, kv_caches)
    hooks.begin_step(input_ids.shape[0])
    hidden, context = model.embed(input_ids, positions)
    stack = getattr(model, "decode_stack_fn", None)
    if stack is not None and not hooks.between_layers():
        stacked = stack(model, hidden, *context, meta, kv_caches)
        if stacked is not None:
            return model.final_norm(stacked, None)
    residual = None
    for i, layer in enumerate(model.layers):
        hooks.before_layer(i)
        hidden, residual = layer.forward_deferred(hidden, residual, *context, meta, kv_caches[i])
        hooks.after_layer(i)
    return model.final_norm(hidden, residual)


def forward_capturing(model, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                      kv_caches: list[torch.Tensor], layers: tuple[int, ...],
                      hooks: LayerHooks = NULL_HOOKS) -> tuple[torch.Tensor, torch.Tensor]:
    """``forward`` that also returns the hidden states entering each decoder layer of ``layers`` (the index
    ``len(model.layers)``: the final norm's output), side by side: ``[T, len(layers) * H]`` (what an EAGLE-3 head or
    a multi-token-prediction layer drafts from, ``speculative/hidden_drafter.py``)."""
    hooks.begin_step(input_ids.shape[0])
    hidden, context = model.embed(input_ids, positions)
    residual = None
    taken: dict[int, torch.Tensor] = {}
    for i, layer in enumerate(model.layers):
        if i in layers:
            taken[i] = hidden if residual is None else hidden + residual
        hooks.before_layer(i)
        hidden, residual = layer.forward_deferred(hidden, residual, *context, meta, kv_caches[i])
        hooks.after_layer(i)
    final = model.final_norm(hidden, residual)
    taken[len(model.layers)] = final
    return final, torch.cat([taken[i] for i in layers], dim=-1)


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_rows: list[int]                      # flat token index whose logits sample, per sampling seq
    sample_index: torch.Tensor                  # the same on the device (int64), for index_select
    prompt_logit_ranges: dict[int, tuple[int, int]]   # scheduled index -> flat [start, end) of prompt logits


@dataclass
class HostStep:
    """One step's inputs as host data, before they reach the device: what ``step_inputs`` unpacks, and what rank 0
    of a tensor-parallel engine sends its workers (``distributed/step_channel.py``)."""
    packed: np.ndarray         # int64: ids, positions, slots [T each], query starts [B+1], seq lens [B], sample rows,
    #                            tables [B, width]
    num_tokens: int
    width: int                 # block table width (padded with 0)
    query_lens: list[int]
    seq_lens: list[int]
    sample_rows: list[int]
    prompt_logit_ranges: dict[int, tuple[int, int]]
    linear_rows: int | None
    # scheduled index -> flat [start, end) of an embedding sequence's rows to pool (rank 0 only: workers pool nothing)
    pool_ranges: dict[int, tuple[int, int]] = field(default_factory=dict)
    # LoRA, for a tensor-parallel engine's workers: (slot, adapter id) copied into a slot before this step, and
    # (slot, tokens) per sequence (lora/registry.py's step_loads / step_runs)
    lora_loads: list[tuple[int, int]] = field(default_factory=list)
    lora_runs: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)


def pack_step(out: SchedulerOutput, block_size: int, linear_rows: int | None = None) -> HostStep:
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_lens: list[int] = []
    seq_lens: list[int] = []
    tables: list[list[int]] = []
    starts = [0]
    sample_rows: list[int] = []
    prompt_ranges: dict[int, tuple[int, int]] = {}
    pool_ranges: dict[int, tuple[int, int]] = {}
    width = 0
    for i, item in enumerate(out.scheduled):
        seq, q = item.seq, item.num_new_tokens
        start, end = seq.num_computed_tokens, seq.num_computed_tokens + q
        flat = starts[-1]
        table = seq.block_ids
        if item.draft_token_ids:
            # a verifying sequence's positions go in as decode rows of their own, each attending to the keys up
            # to its position (attention writes every row's K/V before any row reads): the step stays decode-only
            # and takes the decode kernels, and each row computes what decoding that position computes
            row = block_row(seq)
            for j, token in enumerate(item.token_ids()):
                ids.append(token)
                positions.append(start + j)
                slots.append(table[(start + j) // block_size] * block_size + (start + j) % block_size)
                query_lens.append(1)
                seq_lens.append(start + j + 1)
                tables.append(row)
                sample_rows.append(flat + j)
                starts.append(flat + j + 1)
            width = max(width, len(table))
            continue
        if q == 1:
            ids.append(0 if item.fed else seq.all_token_ids[start])     # a fed id is written on the device
            positions.append(start)
            slots.append(table[start // block_size] * block_size + start % block_size)
        else:
            ids.extend(item.token_ids())
            positions.extend(range(start, end))
            slots.extend(table[p // block_size] * block_size + p % block_size for p in range(start, end))
        if seq.params.prompt_logprobs is not None and start < len(seq.prompt_token_ids):
            prompt_ranges[i] = (flat, flat + min(end, len(seq.prompt_token_ids)) - start)
        query_lens.append(q)
        seq_lens.append(end)
        tables.append(block_row(seq))
        width = max(width, len(table))
        starts.append(flat + q)
        if item.samples:
            sample_rows.append(flat + q - 1)
        elif seq.pooling is not None:
            rows = pool_rows(seq.pooling, start, end, seq.num_tokens, flat)
            if rows is not None:
                pool_ranges[i] = rows
    return HostStep(pack_arrays(ids, positions, slots, starts, seq_lens, sample_rows, tables, width), len(ids), width,
                    query_lens, seq_lens, sample_rows, prompt_ranges, linear_rows, pool_ranges)


def pack_arrays(ids: list[int], positions: list[int], slots: list[int], starts: list[int], seq_lens: list[int],
                sample_rows: list[int], tables: list, width: int) -> np.ndarray:
    """Everything the device needs for a step, packed into one int64 host array in the order ``step_inputs``
    unpacks it: one (non-blocking, pinned) copy. The tables come from each sequence's int32 row
    (kv/block_row.py), which gains only its new blocks from step to step; they are padded with 0 to ``width``."""
    head = [*ids, *positions, *slots, *starts, *seq_lens, *sample_rows]
    packed = np.zeros(len(head) + len(tables) * width, dtype=np.int64)
    packed[:len(head)] = head
    rows = packed[len(head):].reshape(len(tables), width)
    for i, table in enumerate(tables):
        rows[i, :len(table)] = table
    return packed


def step_inputs(step: HostStep, block_size: int, device: torch.device | str = "cpu") -> StepInputs:
    on_device = array_to_device(step.packed, torch.device(device))
    t, b, width = step.num_tokens, step.num_seqs, step.width
    parts = on_device.split([t, t, t, b + 1, b, len(step.sample_rows), b * width])
    meta = AttentionMetadata(
        query_start_loc=parts[3], seq_lens=parts[4], block_tables=parts[6].view(b, width).to(torch.int32),
        slot_mapping=parts[2], query_lens_list=step.query_lens, seq_lens_list=step.seq_lens, block_size=block_size,
        linear_rows=step.linear_rows)
    return StepInputs(parts[0], parts[1], meta, step.sample_rows, parts[5], step.prompt_logit_ranges)


def prepare_inputs(out: SchedulerOutput, block_size: int, device: torch.device | str = "cpu",
                   linear_rows: int | None = None) -> StepInputs:
    return step_inputs(pack_step(out, block_size, linear_rows), block_size, device)


@dataclass
class StepLogits:
    sample_logits: torch.Tensor                        # [num sampling seqs, V] float32
    prompt_logits: dict[int, torch.Tensor]             # scheduled index -> [chunk prompt tokens, V]
    pooled: dict[int, torch.Tensor] = field(default_factory=dict)  # scheduled index -> [H] float64 sum of pooled rows
    # every row's hidden states at the runner's ``capture_layers`` ([T, n * H], the step's flat row order), or None
    hidden: torch.Tensor | None = None


class LoadingLayers(ForwardingHooks):
    """``hooks`` with a step's host KV loads made ready before each decoder layer (kv/layered_load.py): the layers
    run one by one (never in one native call) while a step loads."""

    def __init__(self, hooks: LayerHooks, loads: LayeredLoad):
        self.hooks, self.loads = hooks, loads

    def inner_hooks(self) -> LayerHooks:
        return self.hooks

    def before_layer(self, index: int) -> None:
        self.loads.ready(index)
        self.hooks.before_layer(index)

    def between_layers(self) -> bool:
        return True


class ModelRunner:
    def __init__(self, model: torch.nn.Module, kv_caches: list[torch.Tensor], block_size: int,
                 device: torch.device | str = "cpu", hooks: LayerHooks = NULL_HOOKS, graphs=None,
                 batch_invariant: bool = False, step_sender: Callable[[HostStep], None] | None = None, lora=None):
        """``step_sender``: called with every eager step's inputs before the model runs (rank 0 of a
        tensor-parallel engine sends them to its workers, which ``execute`` them too)."""
        self.model = model
        self.lora = lora
        self.step_sender = step_sender
        self.row_blocks = torch.device(device).type == "cpu"
        self.logit_blocks = RowBlockSizes(LOGIT_MAX_BLOCK_ROWS)   # the logits head's sizes that keep its 8 rows' bits
        self.batch_invariant = batch_invariant
        self.graphs = graphs
        self.hooks = hooks
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        # decoder layers whose input hidden states every step returns (``forward_capturing``; a hidden-state drafter
        # sets them with ``capture``)
        self.capture_layers: tuple[int, ...] | None = None
        self.host_kv = None          # the host KV tier's blocks as attention reads them in place (``read_host_blocks``)
        # the host KV tier's loads for the step about to run (the KV cache manager's ``take_host_loads``), or None
        self.host_loads: Callable[[], LayeredLoad | None] | None = None
        # where set (a synchronous platform with tiers that move), every step with hooks times its decoder layers
        self.layer_times: LayerTimes | None = None

    def read_host_blocks(self, layers) -> None:
        """Every step from now on may name host KV blocks in its tables (``layers``: a ``kv.host_blocks.HostKVLayers``;
        decode graphs too: set before the first step, so every graph is captured reading them)."""
        self.host_kv = layers
        if self.graphs is not None:
            assert not self.graphs.graphs, "host blocks are read from the first step on"
            self.graphs.buffers.host_kv = layers

    def capture(self, layers: tuple[int, ...]) -> None:
        """Every step from now on also returns the hidden states entering ``layers`` (decode graphs too: set before
        the first step, so every graph is captured with them)."""
        self.capture_layers = tuple(layers)
        if self.graphs is not None:
            assert not self.graphs.graphs, "hidden states are captured from the first step on"
            self.graphs.capture_layers = self.capture_layers

    @torch.inference_mode()
    def run(self, out: SchedulerOutput, fed=None) -> StepLogits:
        """``fed``: the step's first input ids on the device (``run_ahead.FedTokens``), for a step launched before
        the previous step's tokens reached the host (not with tensor parallelism)."""
        loads = self.host_loads() if self.host_loads is not None else None
        try:
            if self.lora is None:
                return self._run(out, fed, loads)
            self.lora.begin_step(out.scheduled)
            try:
                return self._run(out, fed, loads)
            finally:
                self.lora.end_step()
        finally:
            if loads is not None:
                loads.finish()

    def _run(self, out: SchedulerOutput, fed=None, loads: LayeredLoad | None = None) -> StepLogits:
        rows = linear_block_rows(out, self.batch_invariant) if self.row_blocks else None
        if rows is None and self.graphs is not None and self.graphs.handles(out):   # every row samples, in order
            if loads is not None:
                loads.finish()         # a replayed graph runs its layers without the hooks between them
            hidden = self.graphs.run(out, fed)
            if self.capture_layers is None:
                return StepLogits(self.model.compute_logits(hidden).float(), {})
            width = hidden.shape[-1] // (1 + len(self.capture_layers))
            return StepLogits(self.model.compute_logits(hidden[:, :width]).float(), {}, {}, hidden[:, width:])
        step = pack_step(out, self.block_size, rows)
        if self.step_sender is not None:
            assert fed is None, "a tensor-parallel engine's workers read their input ids from the host step"
            self.step_sender(step)
        return self.execute(step, fed, loads)

    @torch.inference_mode()
    def execute(self, step: HostStep, fed=None, loads: LayeredLoad | None = None) -> StepLogits:
        """Run the model on ``step`` and compute the logits it needs (``fed``: its input ids, on the device;
        ``loads``: host KV blocks the step's layers load as they run)."""
        rows = step.linear_rows
        inputs = step_inputs(step, self.block_size, self.device)
        inputs.meta.host_kv = self.host_kv
        if fed is not None:
            fed.write_into(inputs.input_ids)
        captured = None
        hooks = self.hooks if loads is None else LoadingLayers(self.hooks, loads)
        timed = None
        if self.layer_times is not None and hooks is not NULL_HOOKS:
            hooks = timed = self.layer_times.timing(hooks, int(inputs.input_ids.shape[0]))
        if self.capture_layers is None:
            hidden = forward(self.model, inputs.input_ids, inputs.positions, inputs.meta, self.kv_caches, hooks)
        else:
            hidden, captured = forward_capturing(self.model, inputs.input_ids, inputs.positions, inputs.meta,
                                                 self.kv_caches, self.capture_layers, hooks)
        if timed is not None:
            timed.finish()
        if not inputs.sample_rows:
            sample_logits = torch.empty(0, 0)
        elif len(inputs.sample_rows) == hidden.shape[0]:   # decode: every row samples, in order
            sample_logits = self.logits(hidden, rows)
        else:
            sample_logits = self.logits(hidden.index_select(0, inputs.sample_index), rows)
        prompt_logits = {i: self.logits(hidden[a:b], rows) for i, (a, b) in inputs.prompt_logit_ranges.items()}
        # float64: a mean's sum hardly depends on where the prompt's chunks were cut; a single row stays exact
        pooled = {i: hidden[a:b].double().sum(0).cpu() for i, (a, b) in step.pool_ranges.items()}
        return StepLogits(sample_logits.float(), {i: t.float() for i, t in prompt_logits.items()}, pooled, captured)

    def logits(self, hidden: torch.Tensor, linear_rows: int | None) -> torch.Tensor:
        """The logits of ``hidden``'s rows; in a step whose linears run in row blocks, the head's too."""
        if linear_rows is None:
            return self.model.compute_logits(hidden)
        head = getattr(getattr(self.model, "lm_head", None), "weight_ref", None)
        route = ("logits", None if head is None else (type(head.current).__qualname__, head.dtype))
        cuts = self.logit_blocks.cuts(route, self.model.compute_logits, hidden.shape[-1], hidden.dtype,
                                      LOGIT_BLOCK_ROWS, hidden.shape[0]) if hidden.shape[0] else None
        return in_row_blocks(self.model.compute_logits, hidden, LOGIT_BLOCK_ROWS, cuts)
