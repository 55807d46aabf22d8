"""The fp8 (e4m3, one scale per output channel, or per row and block for a block-FP8 checkpoint) host weight format
on the CPU, and FP8 checkpoint weights taken over without loss."""
import pytest
import torch
import torch.nn.functional as F

from gh200rt.formats.pack import PackedWeight, pack_weight, quantize_fp8
from gh200rt.formats.packed_layout import FP8_MAX
from gh200rt.formats.quantizers import fp8_blocks_from_checkpoint, fp8_from_checkpoint


def test_quantize_fp8_rounds_each_row_to_the_e4m3_grid():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(37, 53, generator=gen) * torch.logspace(-3, 2, 37)[:, None]  # rows of very different range
    packed = quantize_fp8(w)
    assert packed.qweight.dtype == torch.float8_e4m3fn and packed.scale.shape == (37, 1)
    assert torch.equal(packed.qweight.float().abs().amax(dim=1), torch.full((37,), FP8_MAX))
    rel = ((packed.dequantize() - w).abs() / w.abs().amax(dim=1, keepdim=True)).max().item()
    print(f"fp8 per-channel round trip: worst error {rel:.3e} of the row's largest magnitude")
    assert rel <= 2.0 ** -4 * 1.001  # half a unit in the last place of e4m3 (3 mantissa bits) at the top binade
    assert packed.nbytes == 37 * 53 + 4 * 37


@pytest.mark.parametrize("shape", [(1, 53), (4, 53), (2, 3, 53)], ids=str)
def test_cpu_linear_is_the_dequantized_matmul(shape):
    gen = torch.Generator().manual_seed(len(shape))
    packed = pack_weight(torch.randn(29, 53, generator=gen), "fp8")
    x, bias = torch.randn(*shape, generator=gen), torch.randn(29, generator=gen)
    got = packed.linear(x, bias)
    want = F.linear(x.double(), packed.dequantize().double(), bias.double())
    err = (got.double() - want).abs().max().item()
    print(f"fp8 CPU linear {shape}: worst error {err:.2e}")
    assert got.shape == (*shape[:-1], 29) and err < 1e-5
    xb = x.bfloat16()
    bf16, want_bf16 = packed.linear(xb), F.linear(xb.double(), packed.dequantize().double())
    assert bf16.dtype == torch.bfloat16
    assert (bf16.double() - want_bf16).abs().max().item() <= 2.0 ** -8 * want_bf16.abs().max().item()


@pytest.mark.parametrize("scale_shape", [(), (1,), (29,), (29, 1)], ids=str)
def test_checkpoint_weight_is_kept_bit_for_bit(scale_shape):
    gen = torch.Generator().manual_seed(3)
    q = (torch.randn(29, 53, generator=gen) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    scale = torch.rand(scale_shape, generator=gen) + 0.01
    packed = fp8_from_checkpoint(q, scale)
    assert torch.equal(packed.qweight.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(packed.dequantize(), q.float() * scale.reshape(-1, 1))
    assert pack_weight(packed, "fp8") is packed and pack_weight(packed, "auto") is packed
    assert torch.equal(pack_weight(packed, "bf16"), packed.dequantize().bfloat16())


def test_checkpoint_weight_with_block_scales_is_refused():
    q = torch.zeros(256, 256, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="one scale or one per output channel"):
        fp8_from_checkpoint(q, torch.ones(2, 2))


@pytest.mark.parametrize("block", [(16, 16), (128, 128), (7, 32)], ids=str)
def test_block_scaled_weight_is_kept_bit_for_bit_and_multiplies_as_its_dequantized_form(block):
    """A block-FP8 checkpoint's weight (DeepSeek's layout): codes as stored, each row carrying its block row's
    ``weight_scale_inv``; the CPU linear (float32 and bf16 activations) is the dequantized matmul."""
    from tests.model.fp8_block_checkpoint import dequantize_blocks, quantize_blocks
    gen = torch.Generator().manual_seed(block[0])
    q, scale_inv = quantize_blocks(torch.randn(29, 200, generator=gen), block)
    packed = fp8_blocks_from_checkpoint(q, scale_inv, block)
    assert torch.equal(packed.qweight.view(torch.uint8), q.view(torch.uint8)) and packed.group_size == block[1]
    assert packed.scale.shape == (29, -(-200 // block[1]))
    assert torch.equal(packed.dequantize(), dequantize_blocks(q, scale_inv, block))
    x = torch.randn(3, 200, generator=gen)
    want = F.linear(x.double(), packed.dequantize().double())
    assert (packed.linear(x).double() - want).abs().max().item() < 1e-4
    bf16 = packed.linear(x.bfloat16())
    assert (bf16.double() - want).abs().max().item() <= 2.0 ** -7 * want.abs().max().item()
    with pytest.raises(ValueError, match=r"weight_scale_inv of shape \(2, 2\)"):
        fp8_blocks_from_checkpoint(q[:, :128], scale_inv[:, :1], (16, 64))


def test_with_tensors_rebinds_fp8_storage():
    packed = quantize_fp8(torch.randn(8, 16))
    slot = {name: t.clone() for name, t in packed.tensors().items()}
    rebound = packed.with_tensors(slot, stable=False)
    assert isinstance(rebound, PackedWeight) and rebound.fmt == "fp8"
    x = torch.randn(3, 16)
    assert torch.equal(rebound.linear(x), packed.linear(x))
