"""Packed int8 / int4 weights with bf16 activations (the bf16 CPU route): torch's weight-only ops at every M,
against dequantize-then-matmul in float32, and the same bits from a weight in any tier."""
import pytest
import torch

from gh200rt.formats.pack import quantize_int4, quantize_int8, reference_linear

N, K = 96, 256


def weights():
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(1)) * 0.05
    return {"int8": quantize_int8(w), "int4 g32": quantize_int4(w, 32), "int4 g128": quantize_int4(w, 128)}


@pytest.mark.parametrize("name", ["int8", "int4 g32", "int4 g128"])
@pytest.mark.parametrize("shape", [(1, K), (7, K), (2, 3, K)], ids=["1 row", "7 rows", "3-D"])
def test_bf16_activations_match_the_float32_reference(name, shape):
    packed = weights()[name]
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(*shape, generator=gen).bfloat16()
    bias = torch.randn(N, generator=gen).bfloat16()
    got = packed.linear(x, bias)
    want = reference_linear(x.float(), packed, bias.float())
    err = (got.float() - want).abs().max().item()
    scale = want.abs().max().item()
    print(f"{name} {shape}: worst error {err:.3g} of output scale {scale:.3g}")
    assert got.dtype == torch.bfloat16 and got.shape == (*shape[:-1], N)
    # bf16 scales and outputs: a few bf16 roundings (2^-8 relative) of the output scale, far below a
    # wrong scale / group / nibble order (errors of the order of the output itself)
    assert err <= 2 ** -5 * scale


def test_bf16_route_is_taken_and_caches_nothing_for_changing_storage():
    packed = weights()["int8"]
    x = torch.randn(3, K).bfloat16()
    y = packed.linear(x)
    assert torch.equal(y, torch._weight_int8pack_mm(x, packed.qweight, packed.scale[:, 0].bfloat16()))
    slot = {name: t.clone() for name, t in packed.tensors().items()}
    moving = packed.with_tensors(slot, stable=False)
    assert torch.equal(moving.linear(x), y)  # same bytes, same bits, wherever they sit
    slot["scale"].mul_(2)                     # the slot's contents change: the output follows them
    assert torch.allclose(moving.linear(x).float(), 2 * y.float(), rtol=2e-2, atol=1e-3)
    assert "bf16_scales" not in moving.derived
