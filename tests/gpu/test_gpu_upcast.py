"""A dense weight narrower than the model's dtype on a GPU (a streamed slot, bf16 bytes under an fp32 model):
``UpcastWeight.linear`` upcasts tile by tile in host_gemm's registers instead of copying the whole weight
to the activation dtype on every call (inside a graph that copy landed in the graph's pool, unbooked)."""
import pytest
import torch

from gh200rt.weights.forms import UpcastWeight

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("rows", [1, 8, 300])
def test_upcast_linear_allocates_no_copy_of_the_weight_and_matches_float64(compiled_triton, rows):
    torch.manual_seed(0)
    weight = torch.randn(4096, 2048, device="cuda").to(torch.bfloat16)
    x = torch.randn(rows, 2048, device="cuda")
    bias = torch.randn(4096, device="cuda")
    UpcastWeight(weight).linear(x, bias)        # compiles the kernel outside the measurement
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    y = UpcastWeight(weight).linear(x, bias)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    fp32_copy = weight.numel() * 4
    assert extra < fp32_copy // 4, f"{extra} B allocated: an upcast copy of the weight is {fp32_copy} B"
    want = torch.nn.functional.linear(x.double(), weight.double(), bias.double())
    err = ((y.double() - want).abs().max() / want.abs().max()).item()
    assert y.dtype == torch.float32 and err < 2e-3, f"relative error {err:.2e} (TF32 products: < 2e-3)"
