"""gemv compiled on CUDA at Llama-3-8B's decode shapes: every weight format, in HBM and in pinned host memory,
against the float32 reference, the output poisoned first so an unwritten channel shows; and inside a CUDA graph."""
import pytest
import torch

from gh200rt.formats.pack import pack_weight
from gh200rt.kernels.triton.gemv import gemv, reference_gemv

pytestmark = pytest.mark.gpu
SHAPES = [(6144, 4096), (4096, 14336), (1000, 4096)]
TOLERANCE = 1e-2  # bf16 output against the float32 reference


def pinned(weight):
    def move(t):
        return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t)
    return move(weight) if isinstance(weight, torch.Tensor) else weight.with_tensors(
        {name: move(t) for name, t in weight.tensors().items()})


@pytest.mark.parametrize("fmt", ["bf16", "int8", "fp8", "int4"])
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("where", ["hbm", "host"])
def test_gemv_matches_reference(fmt, n, k, where):
    gen = torch.Generator(device="cuda").manual_seed(n + k)
    dense = torch.randn(n, k, generator=gen, device="cuda", dtype=torch.bfloat16) * 0.02
    weight = pack_weight(dense, fmt)
    weight = pinned(weight) if where == "host" else weight
    x = torch.randn(1, k, generator=gen, device="cuda", dtype=torch.bfloat16) + 0.25
    bias = torch.randn(n, generator=gen, device="cuda", dtype=torch.bfloat16)
    want = reference_gemv(x, pack_weight(dense, fmt), bias)
    got = gemv(x, weight, bias)
    err = ((got.float() - want).abs().max() / want.abs().max()).item()
    assert got.dtype == torch.bfloat16 and err < TOLERANCE, f"{fmt} {where} N={n} K={k}: relative error {err:.2e}"


def test_gemv_in_a_cuda_graph_reads_the_new_input():
    gen = torch.Generator(device="cuda").manual_seed(3)
    weight = torch.randn(4096, 4096, generator=gen, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(1, 4096, generator=gen, device="cuda", dtype=torch.bfloat16)
    gemv(x, weight)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = gemv(x, weight)
    for _ in range(2):
        x.copy_(torch.randn(1, 4096, generator=gen, device="cuda", dtype=torch.bfloat16))
        y.fill_(float("nan"))
        graph.replay()
        want = reference_gemv(x, weight)
        err = ((y.float() - want).abs().max() / want.abs().max()).item()
        assert err < TOLERANCE, f"graph replay: relative error {err:.2e}"
