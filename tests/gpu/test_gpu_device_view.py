"""Host slabs seen from the GPU: device views read the host bytes in place, and direct weights run
through the host_gemm kernel."""
import pytest
import torch
import torch.nn.functional as F

from gh200rt.kernels.triton import host_gemm as host_gemm_module
from gh200rt.models.layers.linear import RefLinear
from gh200rt.numa.alloc import allocate
from gh200rt.weights.device_view import (HostDenseWeight, device_address, device_view, direct_weight,
                                         prepare_slab_for_device)
from tests.gpu.gpu_models import Steps, direct_layers, tiny_arch, tiny_model

PROMPT = [11, 42, 7, 199, 3, 58, 121]


def prepared_slab(nbytes: int, platform):
    slab = allocate(nbytes, node=None, policy="default")
    slab.tensor.copy_(torch.randint(0, 255, (nbytes,), dtype=torch.uint8))
    prepare_slab_for_device(slab, platform)
    return slab


@pytest.mark.gpu
def test_device_view_reads_the_host_bytes_in_place(platform):
    slab = prepared_slab((4 << 20) + 100, platform)
    view = device_view(slab, platform, "cuda")
    assert view.is_cuda and view.dtype == torch.uint8 and view.numel() == slab.nbytes
    assert view.data_ptr() == device_address(slab, platform), "no copy: the view is the slab"
    assert int(view.to(torch.int64).sum()) == int(slab.tensor.to(torch.int64).sum())  # read by a GPU kernel
    assert torch.equal(view.cpu(), slab.tensor)
    slab.tensor[12345] = 7
    slab.tensor[12346] = 201
    assert view[12345:12347].tolist() == [7, 201], "host writes are seen through the view"


@pytest.mark.gh200
def test_gh200_view_is_the_host_address_itself(platform):
    slab = prepared_slab(1 << 20, platform)
    assert platform.ats and device_view(slab, platform, "cuda").data_ptr() == slab.address


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("m", [1, 8, 100])
def test_direct_weight_runs_host_gemm_and_matches_linear(monkeypatch, compiled_triton, platform, dtype, m):
    n, k = 576, 1536
    slab = allocate(n * k * dtype.itemsize, node=None, policy="default")
    prepare_slab_for_device(slab, platform)
    host = slab.tensor.view(dtype).view(n, k)
    host.copy_(torch.randn(n, k).to(dtype))
    weight = direct_weight(device_view(slab, platform, "cuda").view(dtype).view(n, k))
    assert isinstance(weight, HostDenseWeight) and weight.shape == (n, k) and weight.dtype == dtype
    assert weight.nbytes == n * k * dtype.itemsize and weight.device.type == "cuda"
    calls = []
    real = host_gemm_module.host_gemm
    monkeypatch.setattr(host_gemm_module, "host_gemm", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    layer = RefLinear(k, n, bias=False, dtype=dtype, device="cuda")
    layer.weight_ref.current = weight
    x = torch.randn(m, k, device="cuda").to(dtype)
    got = layer(x)
    want = F.linear(x.float(), host.cuda().float())
    err = ((got.float() - want).abs().max() / want.abs().max()).item()
    print(f"direct {dtype} M={m}: worst relative error {err:.2e}")
    assert calls and err < (1e-2 if dtype == torch.bfloat16 or m > 1 else 1e-4)  # bf16 output / TF32 tiles


@pytest.mark.gpu
def test_direct_layers_match_all_resident(compiled_triton, platform):
    arch = tiny_arch()
    ids, want = Steps(tiny_model(arch, torch.float32, "cuda"), "cuda").greedy(PROMPT, 4)
    model = tiny_model(arch, torch.float32, "cuda")
    direct_layers(model, [0, 3, 5], platform)
    got = Steps(model, "cuda").forced(ids, len(PROMPT))
    err = ((got - want).abs().max() / want.abs().max()).item()
    print(f"direct layers 0, 3, 5: worst relative logit error {err:.2e}")
    assert err < 1e-2  # host_gemm uses TF32 tensor cores for the 7-token prefill
