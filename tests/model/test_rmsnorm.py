"""The model's RMSNorm gives transformers' bits (float32 statistics, weight applied in the input dtype)."""
import pytest
import torch

from gh200rt.models.layers.rmsnorm import rms_norm


def transformers_rms_norm(x, weight, eps):
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(1, 576), (7, 2048), (300, 4096), (3, 5, 128), (2, 8192)])
def test_bit_identical_to_transformers(dtype, shape):
    gen = torch.Generator().manual_seed(sum(shape))
    x = (3 * torch.randn(shape, generator=gen)).to(dtype)
    weight = torch.randn(shape[-1], generator=gen).to(dtype)
    got, want = rms_norm(x, weight, 1e-6), transformers_rms_norm(x, weight, 1e-6)
    assert torch.equal(got, want), f"worst difference {(got.float() - want.float()).abs().max().item():.2e}"
