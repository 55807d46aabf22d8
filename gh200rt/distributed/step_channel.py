"""Rank 0 -> workers: each step's inputs (a ``HostStep``, its LoRA slot loads and per-sequence slots included), the
placement moves to make before it (``placement_sync.py``) and the host KV tier's copies rank 0 made since the last step
(``HostKVOps``: ``kv/offload.py``) in two broadcasts on the control group, a fixed header and one int64 payload; a
header whose command is STOP ends the worker's loop."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gh200rt.distributed.parallel_state import ParallelState
from gh200rt.distributed.placement_sync import PlacementMove
from gh200rt.engine.model_runner import HostStep

STEP, STOP = 1, 2
# command, tokens, seqs, block table width, sample rows, linear rows (-1: None), prompt ranges, LoRA slot loads,
# LoRA runs, moves, host KV tier blocks (0: off), host KV stores, host KV loads, payload length
HEADER = 14


@dataclass
class HostKVOps:
    """The host KV tier's copies to repeat before a step: its size in blocks, (device block, host slot) stores and
    (host slot, device block) loads, in that order."""
    host_blocks: int = 0
    stores: list[tuple[int, int]] = field(default_factory=list)
    loads: list[tuple[int, int]] = field(default_factory=list)


def send_step(state: ParallelState, step: HostStep, moves: list[PlacementMove] = (),
              kv: HostKVOps | None = None) -> None:
    kv = kv or HostKVOps()
    ranges = [v for i, (a, b) in step.prompt_logit_ranges.items() for v in (i, a, b)]
    lora = [v for pair in step.lora_loads + step.lora_runs for v in pair]
    copies = [v for pair in kv.stores + kv.loads for v in pair]
    tail = ranges + lora + [v for move in moves for v in move.encode()] + copies
    payload = torch.cat([torch.from_numpy(step.packed), torch.tensor(tail, dtype=torch.int64)])
    rows = -1 if step.linear_rows is None else step.linear_rows
    header = torch.tensor([STEP, step.num_tokens, step.num_seqs, step.width, len(step.sample_rows), rows,
                           len(step.prompt_logit_ranges), len(step.lora_loads), len(step.lora_runs), len(moves),
                           kv.host_blocks, len(kv.stores), len(kv.loads), len(payload)], dtype=torch.int64)
    state.broadcast_control(header)
    state.broadcast_control(payload)


def send_stop(state: ParallelState) -> None:
    state.broadcast_control(torch.tensor([STOP] + [0] * (HEADER - 1), dtype=torch.int64))


def receive_step(state: ParallelState) -> tuple[HostStep, list[PlacementMove], HostKVOps] | None:
    """The next step rank 0 sends, the moves and the host KV copies to make before it, or None when it says stop."""
    header = state.broadcast_control(torch.empty(HEADER, dtype=torch.int64)).tolist()
    command, t, b, width, n_sample, rows, n_ranges, n_loads, n_runs, n_moves, host_blocks, n_stores, n_kv_loads, \
        length = header
    if command == STOP:
        return None
    assert command == STEP, header
    payload = state.broadcast_control(torch.empty(length, dtype=torch.int64))
    tail = 3 * n_ranges + 2 * (n_loads + n_runs) + 4 * n_moves + 2 * (n_stores + n_kv_loads)
    packed, rest = payload[:length - tail].numpy(), payload[length - tail:].tolist()
    ranges, rest = rest[:3 * n_ranges], rest[3 * n_ranges:]
    lora, rest = rest[:2 * (n_loads + n_runs)], rest[2 * (n_loads + n_runs):]
    pairs = [(lora[k], lora[k + 1]) for k in range(0, len(lora), 2)]
    moves, rest = PlacementMove.decode(rest[:4 * n_moves]), rest[4 * n_moves:]
    copies = [(rest[k], rest[k + 1]) for k in range(0, len(rest), 2)]
    kv = HostKVOps(host_blocks, copies[:n_stores], copies[n_stores:])
    starts = packed[3 * t:3 * t + b + 1].tolist()
    seq_lens = packed[3 * t + b + 1:3 * t + 2 * b + 1].tolist()
    sample_rows = packed[3 * t + 2 * b + 1:3 * t + 2 * b + 1 + n_sample].tolist()
    prompt_ranges = {ranges[k]: (ranges[k + 1], ranges[k + 2]) for k in range(0, len(ranges), 3)}
    return HostStep(packed, t, width, [e - s for s, e in zip(starts, starts[1:])], seq_lens, sample_rows,
                    prompt_ranges, None if rows < 0 else rows, lora_loads=pairs[:n_loads],
                    lora_runs=pairs[n_loads:]), moves, kv
