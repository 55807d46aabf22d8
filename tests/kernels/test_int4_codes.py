"""int4 codes widened to a byte each (backends/cpu/int4_codes.py, quant_linear.c's fmt 2): the nibbles' bits for
every row count and thread count, the same dequantized weight, counted in the weight's bytes; and a GGUF
checkpoint's one-row blocks take them where the start-up probe says they pay, booked as they are held."""
from __future__ import annotations

import pytest
import torch

from gh200rt.backends.cpu import int4_codes
from gh200rt.backends.cpu.native import load_native_ops, native_ops_error
from gh200rt.backends.cpu.native_args import quant_weight_args
from gh200rt.backends.cpu.prepack import gguf_blocks_bytes, gguf_blocks_form
from gh200rt.formats.quantizers import quantize_int4

OPS = load_native_ops()
pytestmark = pytest.mark.skipif(OPS is None, reason=f"native CPU ops unavailable: {native_ops_error()}")


def pair(n: int, k: int, group: int, seed: int = 0):
    weight = quantize_int4(torch.randn(n, k, generator=torch.Generator().manual_seed(seed)), group)
    wide = weight.with_tensors(weight.tensors())
    int4_codes.widen(wide)
    return weight, wide


@pytest.mark.parametrize("n, k, group", [(7, 64, 32), (96, 576, 32), (33, 256, 64)])
@pytest.mark.parametrize("rows", [1, 3, 17])
@pytest.mark.parametrize("threads", [1, 2])
def test_widened_codes_give_the_nibbles_bits(n, k, group, rows, threads):
    weight, wide = pair(n, k, group)
    assert quant_weight_args(wide).args.fmt == int4_codes.WIDENED_FMT and quant_weight_args(weight).args.fmt == 1
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)) * 3
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got, want = OPS.quant_linear(x, wide), OPS.quant_linear(x, weight)
    finally:
        torch.set_num_threads(saved)
    assert torch.equal(got, want), (got - want).abs().max()
    # and both are the dequantized weight's product, to the kernel's rounding of the rows
    torch.testing.assert_close(got, x @ weight.dequantize().T, rtol=1e-3, atol=2e-2)


def test_widened_codes_dequantize_and_count():
    weight, wide = pair(40, 128, 32)
    assert torch.equal(OPS.dequantize(wide), weight.dequantize())
    assert wide.nbytes == weight.nbytes + int4_codes.widened_bytes(40, 128)
    codes = wide.derived["widened_codes"][0]
    # chunk order: a chunk's 16 even columns, then its 16 odd ones, each q - 8
    low, high = ((weight.qweight[:, :16] & 0x0F).to(torch.int8) - 8, (weight.qweight[:, :16] >> 4).to(torch.int8) - 8)
    assert torch.equal(codes[:, :16], low) and torch.equal(codes[:, 16:32], high)


def test_a_weight_over_changing_storage_is_not_widened():
    weight = quantize_int4(torch.randn(8, 64), 32)
    with pytest.raises(AssertionError, match="keeps nothing derived"):
        int4_codes.widen(weight.with_tensors(weight.tensors(), stable=False))


def test_the_probe_decides_once_per_process():
    int4_codes.widening_pays.cache_clear()
    first = int4_codes.widening_pays()
    assert isinstance(first, bool) and int4_codes.widening_pays() is first
    assert int4_codes.widening_pays.cache_info().hits == 1


class GgufTensor:
    """A GGUF Q4_1 tensor as the loader hands it (``ggml_type``, ``shape`` [N, K], ``data`` the raw blocks)."""

    def __init__(self, n: int, k: int, seed: int):
        from gh200rt.formats.gguf_blocks import GGML_Q4_1
        gen = torch.Generator().manual_seed(seed)
        blocks = []
        for _ in range(n * k // 32):
            header = torch.tensor([0.01 + torch.rand(1, generator=gen).item() * 0.02,
                                   -torch.rand(1, generator=gen).item() * 0.1]).half().view(torch.uint8)
            codes = torch.randint(0, 256, (16,), dtype=torch.uint8, generator=gen)
            blocks.append(torch.cat([header, codes]))
        self.ggml_type, self.shape = GGML_Q4_1, (n, k)
        self.data = torch.cat(blocks).numpy()


@pytest.mark.parametrize("pays", [True, False])
def test_gguf_one_row_blocks_are_widened_where_it_pays_and_booked_so(monkeypatch, pays):
    monkeypatch.setattr(int4_codes, "widening_pays", lambda threads=None: pays)
    parts = [GgufTensor(32, 64, seed=1), GgufTensor(16, 64, seed=2)]
    blocks = gguf_blocks_form(parts)
    assert blocks is not None and blocks.fmt == "int4"
    assert ("widened_codes" in blocks.derived) == pays
    assert gguf_blocks_bytes(parts) == blocks.nbytes
