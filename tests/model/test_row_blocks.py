"""Row blocks (models/layers/row_blocks.py): the cuts, the probe that finds the block sizes giving a row the base
block's bits, and RefLinear's blocked calls on every CPU linear form, against one base-size call per row."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from gh200rt.formats.pack import pack_weight
from gh200rt.models.layers.dense import onednn_available
from gh200rt.models.layers.linear import ROW_BLOCK_SIZES, RefLinear
from gh200rt.models.layers.row_blocks import (RowBlockSizes, block_cuts, in_row_blocks, ladder, probe_sizes,
                                              smaller_sizes)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("count, cuts", [(1, [64]), (64, [64]), (65, [128]), (80, [128]), (79, [128]),
                                         (300, [256, 64]), (2000, [2048]), (2048, [2048]), (2049, [2048, 64]),
                                         (5000, [2048, 2048, 1024]), (1100, [1024, 128])])
def test_cuts_use_verified_sizes_only_and_pad_little(count, cuts):
    sizes = ladder(64)
    assert sizes == (64, 128, 256, 512, 1024, 2048)
    assert block_cuts(count, sizes) == cuts
    assert block_cuts(count, (64,)) == [64] * -(-count // 64)
    assert block_cuts(300, (64, 1024)) == [64, 64, 64, 64, 64]      # 1,024 would pad 3.4x: base blocks


def _position_dependent(x: torch.Tensor) -> torch.Tensor:
    """A row-wise function whose row 5 of every call is summed in another order (as a tail kernel would)."""
    y = x @ torch.ones(x.shape[1], 3)
    if len(y) > 5:
        y[5] = y[5] + 1e-3
    return y


def _size_dependent(x: torch.Tensor) -> torch.Tensor:
    """Row-wise, but calls of more than 256 rows change every row's bits (as a kernel switch at a size would)."""
    y = x @ torch.ones(x.shape[1], 3)
    return y * (1 + 2 ** -20) if len(x) > 256 else y


def test_the_probe_keeps_only_sizes_with_the_base_bits_and_sees_rows_that_move():
    sizes, position_free = probe_sizes(_size_dependent, 16, torch.float32, 64, ladder(64))
    assert sizes == (64, 128, 256) and position_free
    sizes, position_free = probe_sizes(_position_dependent, 16, torch.float32, 64, ladder(64))
    assert not position_free
    exact = lambda x: x.double().sum(1, keepdim=True).float()       # noqa: E731 - row-wise, any size
    assert probe_sizes(exact, 16, torch.float32, 64, ladder(64)) == (ladder(64), True)


def test_the_book_probes_a_size_when_a_call_would_take_it_and_cuts_around_rejected_ones():
    book = RowBlockSizes()
    assert book.cuts("moving", _position_dependent, 16, torch.float32, 64, 10) == [1] * 10   # one row a call
    assert "moving" in book.position_dependent
    x = torch.randn(10, 16)
    assert torch.equal(in_row_blocks(_position_dependent, x, 64, [1] * 10), torch.cat([_position_dependent(r[None])
                                                                                        for r in x]))
    assert book.cuts("switch", _size_dependent, 16, torch.float32, 64, 100) == [128]
    assert book.verified("switch") == {64: True, 128: True}          # 256 and up not probed yet
    assert book.cuts("switch", _size_dependent, 16, torch.float32, 64, 2000) == [256] * 7 + [256]
    assert book.verified("switch") == {64: True, 128: True, 2048: False, 1024: False, 512: False, 256: True}
    assert book.cuts("switch", _size_dependent, 16, torch.float32, 64, 2000) == [256] * 8   # no probe this time
    assert len(book) == 2


def test_blocks_of_verified_sizes_give_each_row_the_base_bits():
    x = torch.randn(900, 16)
    base = in_row_blocks(_size_dependent, x, 64)
    book = RowBlockSizes()
    cuts = book.cuts("switch", _size_dependent, 16, torch.float32, 64, len(x))
    assert cuts == [256, 256, 256, 128, 64]
    assert torch.equal(in_row_blocks(_size_dependent, x, 64, cuts), base)
    assert not torch.equal(in_row_blocks(_size_dependent, x, 64, [1024]), base)   # an unverified size shows


def _few_rows_elsewhere(x: torch.Tensor) -> torch.Tensor:
    """Row-wise, but calls of up to 8 rows sum another way (as the native fp16 linear takes them from fbgemm)."""
    y = x @ torch.ones(x.shape[1], 3)
    return y * (1 + 2 ** -20) if len(x) <= 8 else y


def test_a_call_of_fewer_rows_than_the_base_takes_the_smallest_verified_size_that_holds_it():
    assert smaller_sizes(64) == (8, 16, 32) and smaller_sizes(16) == (8,) and smaller_sizes(8) == ()
    exact = lambda x: x.double().sum(1, keepdim=True).float()       # noqa: E731 - row-wise, any size
    book = RowBlockSizes()
    assert book.cuts("exact", exact, 16, torch.float32, 64, 5) == [8]
    assert book.cuts("exact", exact, 16, torch.float32, 64, 30) == [32]
    assert book.cuts("exact", exact, 16, torch.float32, 64, 20) == [16, 8]
    assert book.cuts("exact", exact, 16, torch.float32, 64, 64) == [64]
    book = RowBlockSizes()
    assert book.cuts("switch", _few_rows_elsewhere, 16, torch.float32, 64, 5) == [16]   # 8 rows sum another way
    assert book.verified("switch") == {64: True, 8: False, 16: True}
    assert book.cuts("sizes", _size_dependent, 16, torch.float32, 64, 40) == [32, 8]   # no padding
    x = torch.randn(13, 16)
    cuts = book.cuts("switch", _few_rows_elsewhere, 16, torch.float32, 64, len(x))
    assert cuts == [16] and torch.equal(in_row_blocks(_few_rows_elsewhere, x, 64, cuts),
                                        in_row_blocks(_few_rows_elsewhere, x, 64))
    assert not torch.equal(in_row_blocks(_few_rows_elsewhere, x[:5], 64, [8]),
                           in_row_blocks(_few_rows_elsewhere, x[:5], 64))            # an unverified size shows


def _forms(n: int, k: int):
    """Every weight form a CPU RefLinear multiplies, with the activation dtype it takes."""
    gen = torch.Generator().manual_seed(1)
    dense = torch.randn(n, k, generator=gen) * 0.1
    forms = {"float32": (dense, torch.float32), "bf16": (dense.bfloat16(), torch.bfloat16)}
    for fmt in ("int8", "int4", "fp16"):
        forms[fmt] = (pack_weight(dense, fmt), torch.float32)
    from gh200rt.backends.cpu.prepack import OneDNNWeight
    from gh200rt.backends.cpu.routes import route_unavailable
    if route_unavailable("bf16") is None:          # oneDNN reorders bf16 weights with AVX-512 or AVX-NE-CONVERT only
        forms["onednn-bf16"] = (OneDNNWeight(dense.bfloat16()), torch.bfloat16)
    from gh200rt.backends.cpu.prepack import AmxWeight, amx_available
    if amx_available() and k % 32 == 0:
        from gh200rt.backends.cpu.native import load_native_ops
        forms["amx-bf16"] = (AmxWeight(dense.bfloat16(), load_native_ops()), torch.bfloat16)
    return forms


@pytest.mark.parametrize("n, k", [(64, 64), (96, 128), (512, 576)])
def test_a_rows_bits_do_not_depend_on_the_rows_blocked_with_it(n, k):
    """A prompt step's linear: the same row alone (one padded base block) and among 1,500 others (cut into the
    sizes the probe kept), for every weight form."""
    for name, (weight, dtype) in _forms(n, k).items():
        linear = RefLinear(k, n, bias=False, dtype=torch.float32 if name not in ("bf16",) else torch.bfloat16)
        linear.weight_ref.current = weight
        x = torch.randn(1500, k).to(dtype)
        with torch.inference_mode():
            many = linear(x, 64)
            for row in (0, 63, 700, 1499):
                alone = linear(x[row:row + 1], 64)
                assert torch.equal(alone[0], many[row]), (name, row)
    assert len(ROW_BLOCK_SIZES) > 0


@pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN inner product")
def test_float32_blocks_keep_a_rows_bits_under_mkls_avx2_kernels():
    """MKL's AVX2 float32 kernels (what AMD CPUs run, forced on Intel by MKL_ENABLE_INSTRUCTIONS) sum a row of a
    64-row call by its place in the call when the weight has few output columns; blocked calls go to oneDNN."""
    script = textwrap.dedent("""\
        import torch, torch.nn.functional as F
        from gh200rt.models.layers.linear import RefLinear
        torch.manual_seed(0)
        w, x = torch.randn(64, 64), torch.randn(64, 64)
        moved = not torch.equal(F.linear(x, w), F.linear(x.roll(7, 0), w).roll(-7, 0))
        linear = RefLinear(64, 64, bias=False, dtype=torch.float32, weight=w)
        with torch.inference_mode():
            kept = torch.equal(linear(x, 64), linear(x.roll(7, 0), 64).roll(-7, 0))
        print("mkl rows moved", moved, "blocked rows kept", kept)
        """)
    env = {**os.environ, "MKL_ENABLE_INSTRUCTIONS": "AVX2", "PYTHONPATH": ROOT}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "blocked rows kept True" in run.stdout, run.stdout
