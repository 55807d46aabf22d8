"""The dense CPU linear route (oneDNN when probed good, else F.linear) and RefLinear's use of it."""
import pytest
import torch
import torch.nn.functional as F

from gh200rt.models.layers import dense
from gh200rt.models.layers.dense import ONEDNN_MIN_ELEMENTS, dense_linear, uses_onednn
from gh200rt.models.layers.linear import RefLinear

K = 512
N = ONEDNN_MIN_ELEMENTS // K  # the smallest weight oneDNN takes


def inputs(gen):
    return {"1 row": torch.randn(1, K, generator=gen), "7 rows": torch.randn(7, K, generator=gen),
            "3-D": torch.randn(2, 3, K, generator=gen), "1-D": torch.randn(K, generator=gen),
            "non-contiguous": torch.randn(5, 2 * K, generator=gen)[:, ::2],
            "column view": torch.randn(K, 4, generator=gen).T, "empty": torch.randn(0, K, generator=gen)}


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 0), (torch.float16, 0)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_dense_linear_matches_f_linear(dtype, tol, with_bias):
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(N, K, generator=gen).to(dtype)
    bias = torch.randn(N, generator=gen).to(dtype) if with_bias else None
    for name, x in inputs(gen).items():
        x = x.to(dtype)
        got, want = dense_linear(x, w, bias), F.linear(x, w, bias)
        scale = want.float().abs().max().item() if want.numel() else 0.0
        err = (got.float() - want.float()).abs().max().item() if got.numel() else 0.0
        print(f"{dtype} {name} bias={with_bias}: onednn={uses_onednn(x, w, bias)} worst error {err:.2e}")
        assert got.shape == want.shape and got.dtype == want.dtype
        assert err <= tol * max(1.0, scale)


def test_float32_takes_onednn_where_torch_has_it():
    w, x = torch.randn(N, K), torch.randn(3, K)
    assert uses_onednn(x, w, None) == dense.onednn_available()
    assert not uses_onednn(x, torch.randn(N - 1, K), None)        # small weights: F.linear is cheaper
    assert not uses_onednn(x.bfloat16(), w.bfloat16(), None)
    assert not uses_onednn(x, torch.randn(K, N).T, None)          # a transposed view


def test_same_weight_bytes_give_the_same_bits_wherever_they_sit():
    """Resident tensor, a view at an aligned offset of a slab, or a misaligned one: identical output."""
    gen = torch.Generator().manual_seed(2)
    w, bias = torch.randn(N, K, generator=gen), torch.randn(N, generator=gen)
    slab = torch.empty(w.numel() + 64 + 1)
    homes = {"slab +64 B": slab[16:16 + w.numel()].view(N, K), "slab +4 B": slab[1:1 + w.numel()].view(N, K)}
    for x in (torch.randn(1, K, generator=gen), torch.randn(9, K, generator=gen)):
        want = dense_linear(x, w, bias)
        for name, home in homes.items():
            home.copy_(w)
            assert torch.equal(dense_linear(x, home, bias), want), name


def test_failed_probe_falls_back_to_f_linear(monkeypatch):
    def broken(*args):
        raise RuntimeError("could not create a primitive descriptor")
    monkeypatch.setattr(dense, "_onednn_ok", None)
    monkeypatch.setattr(dense, "onednn_linear", broken)
    w, x = torch.randn(N, K), torch.randn(3, K)
    assert torch.equal(dense_linear(x, w), F.linear(x, w))
    assert dense._onednn_ok is False


def test_wrong_answers_fail_the_probe(monkeypatch):
    monkeypatch.setattr(dense, "_onednn_ok", None)
    monkeypatch.setattr(dense, "onednn_linear", lambda x, w, b: F.linear(x, w, b) + 1e-3)
    assert not dense.onednn_available()


def test_ref_linear_reads_the_ref_every_call():
    layer = RefLinear(K, N, bias=True, dtype=torch.float32)
    w1, w2, bias = torch.randn(N, K), torch.randn(N, K), torch.randn(N)
    layer.bias.data.copy_(bias)
    x = torch.randn(2, K)
    layer.weight_ref.current = w1
    assert torch.allclose(layer(x), F.linear(x, w1, bias), rtol=1e-5, atol=1e-4)
    layer.weight_ref.current = w2
    assert torch.allclose(layer(x), F.linear(x, w2, bias), rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(not dense.onednn_available(), reason="this torch has no oneDNN inner product")
@pytest.mark.parametrize("with_bias", [False, True])
def test_one_row_computes_as_the_first_of_two_whatever_the_second(with_bias):
    """The one-row rule: a single row runs as the first of two (the second zero); rows do not mix, so it gets
    the bits it gets beside any other row, and at batch 1 dense and reordered weights agree as at batch 2."""
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(N, K, generator=gen)
    bias = torch.randn(N, generator=gen) if with_bias else None
    x = torch.randn(1, K, generator=gen)
    seconds = {"zero": torch.zeros(1, K), "random": torch.randn(1, K, generator=gen), "huge": 1e6 * x,
               "itself": x}
    want = dense_linear(x, w, bias)
    for name, second in seconds.items():
        pair = torch.ops.mkldnn._linear_pointwise(torch.cat([x, second]), w, bias, "none", [], "")
        assert torch.equal(pair[:1], want), f"second row {name}: worst {(pair[:1] - want).abs().max():.3g}"
    for shape in [(K,), (1, 1, K)]:
        got = dense_linear(x.reshape(shape), w, bias)
        assert got.shape == (*shape[:-1], N) and torch.equal(got.reshape(1, N), want), shape
