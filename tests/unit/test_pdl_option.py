"""``--enable-pdl`` (programmatic dependent launch, kernels/triton/pdl.py): refused with the reason on a GPU older than
Hopper, ignored on the CPU, and the one-call decode hooks carry it."""
import pytest
import torch

from gh200rt.backends import backend_for
from gh200rt.backends.cuda.decode_layer import GpuDecodeLayer, gpu_decode_layer
from gh200rt.backends.cuda.ops import TRITON_OPS
from gh200rt.backends.interface import switch_hooks
from gh200rt.config import EngineConfig
from gh200rt.models.arch_config import ArchConfig
from gh200rt.models.llama import LlamaForCausalLM


def tiny():
    return LlamaForCausalLM(ArchConfig("llama", hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                                       num_kv_heads=2, head_dim=8, vocab_size=97))


def test_a_gpu_older_than_hopper_is_refused_with_its_capability(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    with pytest.raises(ValueError, match=r"--enable-pdl needs .*9\.0.*NVIDIA A100 is 8\.0"):
        backend_for("cuda").install_kernels(tiny(), EngineConfig.from_kwargs(enable_pdl=True), "cuda")


def test_the_cpu_ignores_it():
    model = tiny()
    backend_for("cpu").install_kernels(model, EngineConfig.from_kwargs(enable_pdl=True), "cpu")
    assert not any(isinstance(layer.decode_layer_fn, GpuDecodeLayer) for layer in model.layers)


def test_the_decode_hooks_carry_it():
    model = tiny()
    switch_hooks(model, dict(TRITON_OPS, decode_layer=GpuDecodeLayer(8, pdl=True)))
    assert all(layer.decode_layer_fn == GpuDecodeLayer(8, True) for layer in model.layers)
    assert GpuDecodeLayer() == gpu_decode_layer and not gpu_decode_layer.pdl
