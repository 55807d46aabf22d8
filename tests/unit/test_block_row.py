"""Block tables reach the step inputs through each sequence's int32 row (kv/block_row.py), which gains only the
blocks added since the step before: the tables must equal the padded Python lists they replace, step after step,
as sequences grow, are replaced (a prefix adopted, blocks freed) and leave or join the batch."""
import random

import numpy as np
import torch

from gh200rt.engine.decode_graphs.decode_buffers import DecodeBuffers
from gh200rt.engine.model_runner import pack_step
from gh200rt.kv.block_row import BlockRow, block_row
from gh200rt.sampling_params import SamplingParams
from gh200rt.scheduler.request import Sequence
from gh200rt.scheduler.scheduler import ScheduledSequence, SchedulerOutput


def test_a_row_follows_extends_and_replacements():
    row, ids = BlockRow(), [3, 1]
    assert row.of(ids).tolist() == [3, 1]
    ids.extend(range(100, 140))                     # past the first capacity
    assert row.of(ids).tolist() == [3, 1, *range(100, 140)]
    replaced = [7]                                  # a new list (freed, then a prefix adopted)
    assert row.of(replaced).tolist() == [7]
    assert row.of([]).tolist() == []
    same = [9, 8]
    row.of(same)
    assert row.of(same).dtype == np.int32 and row.of(same).tolist() == [9, 8]


def sequences(rng, count, block_size):
    seqs = []
    for i in range(count):
        n = rng.randrange(1, 60)
        seq = Sequence(f"s{i}", f"s{i}", 0, list(range(n)), SamplingParams(), i)
        seq.num_computed_tokens = n - 1
        seq.block_ids = rng.sample(range(1000), (n + block_size - 1) // block_size)
        seqs.append(seq)
    return seqs


def padded(seqs):
    width = max(len(s.block_ids) for s in seqs)
    return [s.block_ids + [0] * (width - len(s.block_ids)) for s in seqs]


def advance(rng, seqs, block_size):
    """One decode step's growth, and now and then a sequence's table replaced by a new list."""
    for seq in seqs:
        seq.num_computed_tokens += 1
        seq.all_token_ids.append(1)
        if seq.num_computed_tokens // block_size >= len(seq.block_ids):
            seq.block_ids.extend([rng.randrange(1000)])
        if rng.random() < 0.05:
            seq.block_ids = rng.sample(range(1000), len(seq.block_ids))


def test_decode_buffers_and_packed_steps_carry_the_padded_tables_step_after_step():
    rng, bs = random.Random(0), 4
    pool = sequences(rng, 12, bs)
    buffers = DecodeBuffers(16, 64, bs, "cpu")
    for step in range(40):
        batch = rng.sample(pool, rng.randrange(1, len(pool) + 1))      # sequences leave and join
        out = SchedulerOutput([ScheduledSequence(s, 1) for s in batch])
        want = padded(batch)
        buffers.fill(out, 16)
        width = len(want[0])
        tables = buffers.block_tables
        assert tables[:len(batch), :width].tolist() == want, step
        assert not tables[len(batch):].any() and not tables[:, width:].any(), step
        host = pack_step(out, bs)
        assert host.width == width and host.packed.dtype == np.int64
        assert host.packed[-len(batch) * width:].reshape(len(batch), width).tolist() == want, step
        advance(rng, pool, bs)
    assert all(block_row(s).tolist() == s.block_ids for s in pool)
    assert isinstance(torch.from_numpy(host.packed), torch.Tensor)
