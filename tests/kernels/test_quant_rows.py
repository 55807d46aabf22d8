"""Quantizing in blocks of rows on several threads (``quantize_rows``) gives bit for bit what one call over the
whole weight gives, for every format, odd row counts and groups that do not divide K."""
import pytest
import torch

from gh200rt.formats.pack import pack_weight, quantize_fp8, quantize_int4, quantize_int8
from gh200rt.formats.quantizers import quantize_rows

WHOLE = {"int8": quantize_int8, "int4": quantize_int4, "fp8": quantize_fp8}


@pytest.mark.parametrize("fmt", sorted(WHOLE))
@pytest.mark.parametrize("shape, rows, workers", [((515, 96), 64, 3), ((1000, 40), 256, 2), ((7, 64), 4, 2)])
def test_blocks_of_rows_equal_one_call(fmt, shape, rows, workers):
    torch.manual_seed(0)
    w = (torch.randn(*shape) * 0.05).to(torch.bfloat16)
    w[3] = 0                                     # an all-zero row: the scale's floor
    want, got = WHOLE[fmt](w), quantize_rows(w, fmt, workers, rows)
    assert got.shape == want.shape and got.group_size == want.group_size
    for name, tensor in want.tensors().items():
        assert torch.equal(got.tensors()[name].view(torch.uint8), tensor.view(torch.uint8)), (fmt, name)


def test_pack_weight_passes_its_workers_on():
    w = (torch.randn(600, 64) * 0.05).to(torch.float32)
    assert torch.equal(pack_weight(w, "int8", workers=4).qweight, quantize_int8(w).qweight)


@pytest.mark.parametrize("fmt", ["int8", "int4", "fp8"])
@pytest.mark.parametrize("shape", [(96, 64), (40, 200)])
def test_empty_packed_has_the_layout_of_a_quantized_weight(fmt, shape):
    """What the slab cache compares a stored slab with, computed from the shape without quantizing."""
    from gh200rt.formats.quantizers import empty_packed
    real = quantize_rows(torch.randn(*shape), fmt, workers=2, rows=16)
    empty = empty_packed(fmt, shape)

    def layout(p):
        parts = [p.qweight, p.scale] + ([p.minimum] if p.minimum is not None else [])
        return [(tuple(t.shape), t.dtype) for t in parts], p.group_size, p.shape, p.fmt
    assert layout(empty) == layout(real) and empty.qweight.device.type == "meta"


@pytest.mark.parametrize("fmt", sorted(WHOLE))
@pytest.mark.parametrize("workers", [1, 3])
def test_stacked_tensors_equal_one_call_over_their_concatenation(fmt, workers):
    """A fused linear (q, k, v of different heights; a second group beside it) quantized block by block into one
    result: the same bytes as quantizing the concatenated weight, and torch's thread count as it was."""
    from gh200rt.formats.quantizers import quantize_stacked
    torch.manual_seed(1)
    qkv = [(torch.randn(n, 96) * 0.05).to(torch.bfloat16) for n in (70, 17, 17)]
    down = [(torch.randn(33, 64) * 0.05).to(torch.bfloat16)]
    threads = torch.get_num_threads()
    got = quantize_stacked({"qkv": qkv, "down": down}, fmt, workers, rows=16, dtype=torch.float32)
    assert torch.get_num_threads() == threads
    for name, parts in (("qkv", qkv), ("down", down)):
        want = WHOLE[fmt](torch.cat(parts).float())
        assert got[name].shape == want.shape and got[name].group_size == want.group_size
        for key, tensor in want.tensors().items():
            assert torch.equal(got[name].tensors()[key].view(torch.uint8), tensor.view(torch.uint8)), (name, key)


def test_a_failing_block_restores_torch_threads(monkeypatch):
    from gh200rt.formats import quantizers
    threads = torch.get_num_threads()

    def broken(block):
        raise MemoryError("a block's temporaries did not fit")
    monkeypatch.setitem(quantizers._QUANTIZERS, "int8", broken)
    with pytest.raises(MemoryError):
        quantizers.quantize_stacked({"w": [torch.randn(40, 8)]}, "int8", 2, rows=8)
    assert torch.get_num_threads() == threads


def test_int4_g128_is_int4_in_groups_of_128_and_planned_at_its_size():
    """``--host-weight-dtype int4-g128``: the int4 layout with a scale and minimum per 128 columns, quantized alike by
    one call or by row blocks on threads, and the cost model sizes it as stored (4.5 bits a weight)."""
    from gh200rt.formats.quantizers import empty_packed
    from gh200rt.planner.cost_model import host_weight_parts
    w = torch.randn(300, 512, generator=torch.Generator().manual_seed(0))
    packed = pack_weight(w, "int4-g128")
    assert packed.fmt == "int4" and packed.group_size == 128 and packed.scale.shape == (300, 4)
    threaded = quantize_rows(w, "int4-g128", workers=2, rows=64)
    assert all(torch.equal(a, b) for a, b in zip(packed.tensors().values(), threaded.tensors().values()))
    layout = empty_packed("int4-g128", (300, 512))
    assert {n: t.shape for n, t in layout.tensors().items()} == {n: t.shape for n, t in packed.tensors().items()}
    assert sum(host_weight_parts("int4-g128", (300, 512))) == packed.nbytes == 300 * 512 // 2 + 2 * 4 * 300 * 4
    err = (packed.dequantize() - w).abs().max() / w.abs().max()
    assert err < 0.1, err
