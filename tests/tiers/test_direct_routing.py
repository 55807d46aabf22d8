"""How a dense offloaded weight is bound: a view the device reads in place (anything but a CPU tensor)
always goes to the direct-read wrapper (host_gemm on CUDA), whatever the compute dtype, so no
per-call upcast copy of the whole weight lands in device memory."""
import pytest
import torch

from gh200rt.weights.forms import UpcastWeight, bind


class Recorded:
    def __init__(self, view):
        self.view = view


@pytest.mark.parametrize("host_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("compute_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_device_views_always_take_the_direct_wrapper(host_dtype, compute_dtype):
    view = torch.empty(8, 4, dtype=host_dtype, device="meta")  # stands in for a CUDA view of a host slab
    bound = bind(view, {"weight": view}, compute_dtype, stable=True, wrap_dense=Recorded)
    assert isinstance(bound, Recorded) and bound.view is view


def test_cpu_views_upcast_when_dtypes_differ():
    view = torch.randn(8, 4).to(torch.bfloat16)
    bound = bind(view, {"weight": view}, torch.float32, stable=True, wrap_dense=lambda v: v)
    assert isinstance(bound, UpcastWeight)
    x = torch.randn(3, 4)
    assert torch.equal(bound.linear(x), torch.nn.functional.linear(x, view.float()))
    same = torch.randn(8, 4)
    assert bind(same, {"weight": same}, torch.float32, stable=True, wrap_dense=lambda v: v) is same
