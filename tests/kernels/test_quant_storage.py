"""The fp16 host format, and packed weights over storage whose contents change (``stable=False``)."""
import pytest
import torch
import torch.nn.functional as F

from gh200rt.backends.cpu import half_linear
from gh200rt.formats import pack
from gh200rt.formats.pack import HalfWeight, pack_weight, quantize_int4, quantize_int8, reference_linear

N, K = 48, 192


def make(fmt: str, w: torch.Tensor):
    """One weight in each format and CPU route whose derived form could be cached."""
    if fmt == "fp16":
        return pack_weight(w, "fp16")
    if fmt == "int8-fbgemm":
        return quantize_int8(w, cpu_route="fbgemm")
    return quantize_int4(w, 32)


def slot_copy(weight, stable: bool):
    """``weight`` rebound over fresh storage, as a placement binds a staging slot (stable=False) or a slab."""
    slot = {name: torch.empty_like(t) for name, t in weight.tensors().items()}
    for name, t in weight.tensors().items():
        slot[name].copy_(t)
    return weight.with_tensors(slot, stable=stable), slot


@pytest.mark.parametrize("fmt", ["fp16", "int8-fbgemm", "int4"])
@pytest.mark.parametrize("rows", [1, 3])
def test_unstable_weight_reads_the_slot_on_every_call(fmt, rows):
    gen = torch.Generator().manual_seed(1)
    weight = make(fmt, torch.randn(N, K, generator=gen))
    x = torch.randn(rows, K, generator=gen)
    streamed, slot = slot_copy(weight, stable=False)
    direct, _ = slot_copy(weight, stable=True)
    first = streamed.linear(x)
    assert torch.equal(first, direct.linear(x)), "same bytes must give the same bits whatever the tier"
    for t in slot.values():  # what the transfer tests do to a slot before each copy
        t.copy_(torch.full_like(t, float("nan")) if t.is_floating_point() else torch.full_like(t, 7))
    poisoned = streamed.linear(x)
    assert not torch.equal(poisoned, first), f"{fmt}: a stable=False weight served a cached copy of the slot"
    for name, t in weight.tensors().items():  # the next copy restores the layer: same bits again
        slot[name].copy_(t)
    assert torch.equal(streamed.linear(x), first)


@pytest.mark.parametrize("fmt", ["fp16", "int8-fbgemm", "int4"])
def test_stable_weight_may_cache_its_derived_form(fmt):
    weight = make(fmt, torch.randn(N, K))
    direct, _ = slot_copy(weight, stable=True)
    x = torch.randn(2, K)
    direct.linear(x)
    assert direct.stable and weight.with_tensors(weight.tensors()).stable
    assert direct.nbytes >= sum(t.nbytes for t in direct.tensors().values())


@pytest.mark.parametrize("shape", [(1, K), (5, K), (2, 3, K), (K,), (0, K)], ids=str)
@pytest.mark.parametrize("with_bias", [False, True])
def test_fp16_linear_is_exact_for_the_fp16_weight(shape, with_bias):
    gen = torch.Generator().manual_seed(len(shape))
    w = torch.randn(N, K, generator=gen)
    half = pack_weight(w, "fp16")
    x = torch.randn(*shape, generator=gen)
    bias = torch.randn(N, generator=gen) if with_bias else None
    got = half.linear(x, bias)
    want = F.linear(x.double(), half.weight.double(), None if bias is None else bias.double())
    err = (got.double() - want).abs().max().item() if got.numel() else 0.0
    print(f"fp16 x{tuple(shape)} bias={with_bias}: worst error vs float64 {err:.2e}")
    assert got.shape == (*shape[:-1], N) and got.dtype == torch.float32
    assert err < 1e-5 * max(1.0, want.abs().max().item()) if got.numel() else True


def test_fp16_linear_takes_non_contiguous_and_bf16_inputs():
    half = pack_weight(torch.randn(N, K), "fp16")
    x = torch.randn(4, 2 * K)[:, ::2]
    assert torch.allclose(half.linear(x), reference_linear(x, half), rtol=1e-5, atol=1e-5)
    y = half.linear(x.bfloat16())
    assert y.dtype == torch.bfloat16 and torch.allclose(y.float(), reference_linear(x, half), rtol=0.05, atol=0.1)


def test_fp16_without_fbgemm_widens_the_weight(monkeypatch):
    half = pack_weight(torch.randn(N, K), "fp16")
    x, bias = torch.randn(half_linear.NATIVE_F16_MAX_ROWS + 1, K), torch.randn(N)   # beyond the native fp16 linear
    monkeypatch.setattr(half_linear, "_fbgemm_fp16_ok", False)
    assert torch.equal(half.linear(x, bias), F.linear(x, half.weight.float(), bias))
    assert torch.equal(half.linear(x[:3], bias, native=False), F.linear(x[:3], half.weight.float(), bias))
    assert "fbgemm" not in half.derived


def test_fp16_pack_weight_and_its_errors():
    w = torch.randn(N, K)
    half = pack_weight(w, "fp16")
    assert isinstance(half, HalfWeight) and half.nbytes == N * K * 2 and half.shape == (N, K)
    assert torch.equal(half.dequantize(), w.half().float())
    assert set(half.tensors()) == {"weight"} and half.tensors()["weight"].dtype == torch.float16
    with pytest.raises(ValueError, match="float16's range"):
        pack_weight(torch.full((4, 4), 1e6), "fp16")
    assert "fp16" in pack.HOST_FORMATS


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8])
def test_fp16_on_cuda_reads_the_fp16_tensor_through_host_gemm(monkeypatch, m):
    from gh200rt.kernels.triton import host_gemm as host_gemm_module
    calls = []
    real = host_gemm_module.host_gemm
    monkeypatch.setattr(host_gemm_module, "host_gemm", lambda x, w, b=None: calls.append(w) or real(x, w, b))
    half = pack_weight(torch.randn(320, 576), "fp16")
    on_gpu = half.with_tensors({"weight": half.weight.cuda()})
    x = torch.randn(m, 576, device="cuda")
    y = on_gpu.linear(x)
    want = x @ half.weight.cuda().float().T
    err = ((y - want).abs().max() / want.abs().max()).item()
    print(f"fp16 M={m} on CUDA: worst relative error {err:.2e}")
    assert calls and calls[0].dtype == torch.float16 and calls[0].is_cuda and err < 5e-3
