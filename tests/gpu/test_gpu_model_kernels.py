"""use_triton_kernels on a CUDA model: the Triton attention, KV store, RMSNorm, RoPE (and SiLU where the
MLP uses the SiluAndMul module) give the logits of the torch path."""
import pytest
import torch

from gh200rt.models import gpu_kernels
from gh200rt.models.gpu_kernels import use_torch_kernels, use_triton_kernels
from gh200rt.models.layers.attention import SelfAttention
from gh200rt.models.layers.rmsnorm import RMSNorm
from tests.gpu.gpu_models import Steps, tiny_arch, tiny_model

pytestmark = pytest.mark.gpu

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("qk_norm", [False, True], ids=["llama", "qwen3-qk-norm"])
@pytest.mark.parametrize("prompt_len", [7, 40], ids=["kernel-prefill", "torch-prefill"])
def test_triton_model_matches_torch_path(compiled_triton, dtype, qk_norm, prompt_len):
    arch = tiny_arch(qk_norm)
    model = tiny_model(arch, dtype, "cuda")
    prompt = [(31 * i + 5) % arch.vocab_size for i in range(prompt_len)]
    ids, want = Steps(model, "cuda").greedy(prompt, 5)
    assert use_triton_kernels(model) is True
    assert all(m.attention_fn is gpu_kernels.triton_paged_attention
               for m in model.modules() if isinstance(m, SelfAttention))
    assert all(m.norm_fn is gpu_kernels.triton_rms_norm for m in model.modules() if isinstance(m, RMSNorm))
    got = Steps(model, "cuda").forced(ids, prompt_len)
    err = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
    print(f"Triton vs torch {dtype} qk_norm={qk_norm} prompt={prompt_len}: worst relative logit error {err:.2e}")
    assert err < TOLERANCE[dtype]
    use_torch_kernels(model)
    again = Steps(model, "cuda").forced(ids, prompt_len)
    assert torch.equal(again, want)
