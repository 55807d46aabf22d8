"""use_triton_kernels on a CUDA model: the Triton attention, KV store, RMSNorm, RoPE (and SiLU where the
MLP uses the SiluAndMul module) give the logits of the torch path, with RoPE and the store fused into one launch
(Qwen3's q/k norms too) and the attention's residual add fused into the next norm."""
import pytest
import torch

from gh200rt.backends.cuda import ops as cuda_ops
from gh200rt.backends.cuda.ops import use_triton_kernels
from gh200rt.backends.interface import use_torch_kernels
from gh200rt.models.layers.attention import SelfAttention
from gh200rt.models.layers.rmsnorm import RMSNorm
from tests.gpu.gpu_models import Steps, tiny_arch, tiny_model

pytestmark = pytest.mark.gpu

FP32_TOLERANCE = 1e-4
BF16_MARGIN = 1.10        # the Triton path's error may exceed the torch path's by this factor at most
BF16_CEILING = 0.15       # and neither strays further than this from the float32 run (bf16 linears)


def float32_twin(model, arch):
    """The same weights (bf16 values, exactly) in a float32 model on the torch kernels: the reference both
    bf16 paths are measured against (matmuls in full float32: nothing enables TF32)."""
    twin = tiny_model(arch, torch.float32, "cuda")
    source = model.weight_destinations()
    for name, tensor in twin.weight_destinations().items():
        tensor.copy_(source[name].float())
    use_torch_kernels(twin)
    return twin


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("qk_norm", [False, True], ids=["llama", "qwen3-qk-norm"])
@pytest.mark.parametrize("prompt_len", [7, 40], ids=["kernel-prefill", "torch-prefill"])
def test_triton_model_matches_torch_path(compiled_triton, dtype, qk_norm, prompt_len):
    """float32: the two paths agree to 1e-4. bf16: comparing two bf16 paths with each other judges nothing (on
    random weights they differ by a few percent, each rounding its own way); both are measured against a float32
    run of the same weights, and the Triton path, which computes in float32 inside each kernel, must be no
    further from it than the torch path."""
    arch = tiny_arch(qk_norm)
    model = tiny_model(arch, dtype, "cuda")
    prompt = [(31 * i + 5) % arch.vocab_size for i in range(prompt_len)]
    ids, torch_path = Steps(model, "cuda").greedy(prompt, 5)
    assert use_triton_kernels(model) is True
    assert all(m.attention_fn is cuda_ops.triton_paged_attention
               for m in model.modules() if isinstance(m, SelfAttention))
    assert all(m.norm_fn is cuda_ops.triton_rms_norm and m.add_norm_fn is cuda_ops.triton_add_rms_norm
               for m in model.modules() if isinstance(m, RMSNorm))
    assert all(m.decode_block_fn is cuda_ops.triton_decode_block   # q/k norms, RoPE and the KV store fused
               for m in model.modules() if isinstance(m, SelfAttention))
    triton_path = Steps(model, "cuda").forced(ids, prompt_len)
    if dtype == torch.float32:
        err = relative_error(triton_path, torch_path)
        print(f"Triton vs torch fp32 qk_norm={qk_norm} prompt={prompt_len}: worst relative logit error {err:.2e}")
        assert err < FP32_TOLERANCE
    else:
        reference = Steps(float32_twin(model, arch), "cuda").forced(ids, prompt_len)
        triton_err, torch_err = relative_error(triton_path, reference), relative_error(torch_path, reference)
        print(f"bf16 qk_norm={qk_norm} prompt={prompt_len}, worst relative logit error against float32: "
              f"Triton {triton_err:.2e}, torch {torch_err:.2e}")
        assert triton_err <= BF16_MARGIN * torch_err and max(triton_err, torch_err) < BF16_CEILING
    use_torch_kernels(model)
    again = Steps(model, "cuda").forced(ids, prompt_len)
    assert torch.equal(again, torch_path)
