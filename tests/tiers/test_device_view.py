"""Host slabs on the cpu platform: prepare is a no-op, the device view is the slab itself, and a direct
weight is the host view (torch reads it in place). The CUDA paths are in tests/gpu."""
import torch
import torch.nn.functional as F

from gh200rt.weights.device_view import device_address, device_view, direct_weight, prepare_slab_for_device
from gh200rt.weights.slabs import allocate_slab
from gh200rt.models.layers.linear import RefLinear
from gh200rt.platform.detect import Platform, detect
from gh200rt.platform.profiles import get_profile

CPU = detect("cpu")


def test_cpu_view_is_the_slab_itself():
    slab = allocate_slab(1000)
    slab.tensor.copy_(torch.arange(1000, dtype=torch.int64).to(torch.uint8))
    prepare_slab_for_device(slab, CPU)
    view = device_view(slab, CPU, "cpu")
    assert view.dtype == torch.uint8 and view.numel() == 1000 and view.data_ptr() == slab.tensor.data_ptr()
    slab.tensor[7] = 200
    assert int(view[7]) == 200, "zero-copy: writes to the slab are seen through the view"


def test_cpu_direct_weight_is_the_view_and_linear_reads_it():
    slab = allocate_slab(12 * 20 * 4)
    weight = device_view(slab, CPU, "cpu").view(torch.float32).view(12, 20)
    weight.copy_(torch.randn(12, 20))
    assert direct_weight(weight) is weight
    layer = RefLinear(20, 12, bias=False, dtype=torch.float32)
    layer.weight_ref.current = direct_weight(weight)
    x = torch.randn(3, 20)
    assert torch.equal(layer(x), F.linear(x, weight))


class _RegisteredSlab:
    """Just the two addresses of a registered host buffer (no CUDA call is made here)."""
    address = 0x7F0000001000

    def device_pointer(self):
        return 0x200000000


def test_kernels_read_the_host_address_with_ats_and_the_mapped_pointer_without():
    gh200 = Platform.from_profile(get_profile("gh200-96g"))
    x86 = Platform.from_profile(get_profile("h100-pcie"))
    assert device_address(_RegisteredSlab(), gh200) == _RegisteredSlab.address
    assert device_address(_RegisteredSlab(), x86) == 0x200000000
