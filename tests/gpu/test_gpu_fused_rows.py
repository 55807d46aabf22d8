"""fused_rows compiled on CUDA at Llama-3-8B's decode products, 2-64 rows: each fusion against the torch reference,
the output poisoned first so an unwritten row or channel shows (rows past M in a tile must not be stored), every
tile bench_gpu_skinny sweeps, and inside a CUDA graph."""
import pytest
import torch

from gh200rt.kernels.triton.fused_rows import SWEEP_TILES, block_rows, fused_rows, reference_fused_rows

pytestmark = pytest.mark.gpu
# (N, K, fusion) of a decode layer's four products
PRODUCTS = [(6144, 4096, "norm"), (4096, 4096, "residual"), (28672, 4096, "norm"), (4096, 14336, "gated+residual")]
TOLERANCE = 2 ** -6   # bf16 outputs, a different summation order, against the reference's rounding points


def operands(rows: int, n: int, k: int, fusion: str, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    gated = "gated" in fusion
    weight = torch.randn(n, k, generator=gen, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(rows, 2 * k if gated else k, generator=gen, device="cuda", dtype=torch.bfloat16)
    norm = ((1 + 0.1 * torch.randn(k, generator=gen, device="cuda")).to(torch.bfloat16), 1e-5) \
        if "norm" in fusion else None
    residual = torch.randn(rows, n, generator=gen, device="cuda", dtype=torch.bfloat16) \
        if "residual" in fusion else None
    return x, weight, dict(norm=norm, gated=gated, residual=residual)


def relative_error(got, want) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


@pytest.mark.parametrize("rows", [2, 8, 13, 64])
@pytest.mark.parametrize("n,k,fusion", PRODUCTS)
def test_fused_rows_match_the_reference_at_decode_shapes(rows, n, k, fusion, monkeypatch):
    x, weight, fused = operands(rows, n, k, fusion, seed=rows * n + k)
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: real_empty(*a, **kw).fill_(float("nan")))
    got = fused_rows(x, weight, **fused)
    monkeypatch.undo()
    want = reference_fused_rows(x, weight, **fused)
    assert not got.isnan().any(), "an output was never written"
    err = relative_error(got, want)
    assert err <= TOLERANCE, f"{rows} rows N={n} K={k} {fusion}: relative error {err:.2e}"


@pytest.mark.parametrize("rows", [8, 24, 64])
def test_every_swept_tile_compiles_and_computes(rows):
    from triton.runtime.errors import OutOfResources
    x, weight, fused = operands(rows, 4096, 14336, "gated+residual", seed=rows)
    want = reference_fused_rows(x, weight, **fused)
    for block_n, block_k, warps, dot_16bit in SWEEP_TILES[block_rows(rows)]:
        tile = dict(BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, DOT_16BIT=dot_16bit)
        try:
            got = fused_rows(x, weight, tile=tile, **fused)
        except OutOfResources as exc:
            pytest.fail(f"tile {tile} at {rows} rows: {exc}")
        assert relative_error(got, want) <= TOLERANCE, tile


def test_fused_rows_in_a_cuda_graph_read_the_new_rows():
    x, weight, fused = operands(8, 4096, 4096, "norm", seed=5)
    fused_rows(x, weight, **fused)          # compiled before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_rows(x, weight, **fused)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert relative_error(out, reference_fused_rows(x, weight, **fused)) <= TOLERANCE
