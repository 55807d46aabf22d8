"""Rank 0's step message and what a worker reads back: the step, the placement moves and the host KV tier's copies
(stores, then loads) each come back as sent, whatever else the message carries."""
from __future__ import annotations

import numpy as np
import torch

from gh200rt.distributed.placement_sync import PlacementMove
from gh200rt.distributed.step_channel import HostKVOps, receive_step, send_step, send_stop
from gh200rt.engine.model_runner import HostStep, pack_arrays
from gh200rt.weights.tiers import Tier


class Loopback:
    """The control group's broadcasts in one process: rank 0's are kept, then the worker's read them in order."""

    def __init__(self):
        self.sent: list[torch.Tensor] = []
        self.reading = False

    def broadcast_control(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.reading:
            return tensor.copy_(self.sent.pop(0))
        self.sent.append(tensor.clone())
        return tensor


def step() -> HostStep:
    tables = [np.array([3, 4], dtype=np.int32), np.array([7], dtype=np.int32)]
    packed = pack_arrays([11, 12, 13], [0, 1, 5], [48, 49, 117], [0, 2, 3], [2, 6], [1, 2], tables, 2)
    return HostStep(packed, 3, 2, [2, 1], [2, 6], [1, 2], {0: (0, 2)}, None, lora_loads=[(1, 9)], lora_runs=[(1, 2)])


def test_a_step_with_moves_and_host_kv_copies_comes_back_as_sent():
    channel = Loopback()
    moves = [PlacementMove(3, -1, Tier.STREAMED, -1), PlacementMove(5, 2, Tier.RESIDENT, 40)]
    kv = HostKVOps(96, stores=[(4, 0), (7, 1), (3, 95)], loads=[(1, 12), (0, 13)])
    send_step(channel, step(), moves, kv)
    send_step(channel, step())
    send_stop(channel)
    channel.reading = True
    got, got_moves, got_kv = receive_step(channel)
    assert (got.num_tokens, got.width, got.query_lens, got.seq_lens, got.sample_rows) == (3, 2, [2, 1], [2, 6], [1, 2])
    assert np.array_equal(got.packed, step().packed) and got.prompt_logit_ranges == {0: (0, 2)}
    assert (got.lora_loads, got.lora_runs) == ([(1, 9)], [(1, 2)])
    assert got_moves == moves and got_kv == kv
    _, no_moves, no_kv = receive_step(channel)
    assert no_moves == [] and no_kv == HostKVOps()
    assert receive_step(channel) is None
