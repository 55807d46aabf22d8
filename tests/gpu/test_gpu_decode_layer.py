"""The one-row decode layer in six launches (models/gpu_decode_layer.py) compiled on CUDA: the op-by-op Triton
path's logits (float32 to 1e-5; bfloat16 teacher-forced to a few units of the last place, the same greedy
tokens), taken on every decode step, and three launches fewer per layer and step (nine op by op, where the
residual add at a layer boundary is fused into the next norm)."""
import pytest
import torch

from gh200rt.models.gpu_kernels import use_triton_kernels
from tests.gpu.gpu_models import Steps, tiny_arch, tiny_model

pytestmark = pytest.mark.gpu


def kernels_in(fn) -> int:
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("qk_norm", [False, True], ids=["llama", "qwen3-qk-norm"])
def test_fused_layers_give_the_op_by_op_logits(compiled_triton, dtype, qk_norm):
    arch = tiny_arch(qk_norm)
    model = tiny_model(arch, dtype, "cuda")
    assert use_triton_kernels(model) is True
    prompt = [(31 * i + 5) % arch.vocab_size for i in range(9)]
    fused_ids, _ = Steps(model, "cuda").greedy(prompt, 6)
    fused = Steps(model, "cuda").forced(fused_ids, len(prompt))
    hooks = [layer.decode_layer_fn for layer in model.layers]
    for layer in model.layers:
        layer.decode_layer_fn = None
    op_by_op = Steps(model, "cuda").forced(fused_ids, len(prompt))
    err = ((fused.float() - op_by_op.float()).abs().max() / op_by_op.float().abs().max()).item()
    print(f"{dtype} qk_norm={qk_norm}: fused vs op by op, worst relative logit difference {err:.2e}")
    assert err <= (1e-5 if dtype == torch.float32 else 2 ** -6)
    assert torch.equal(fused[len(prompt) - 1:].argmax(-1), op_by_op[len(prompt) - 1:].argmax(-1))
    steps = Steps(model, "cuda")
    steps.run(prompt, len(prompt))
    unfused_kernels = kernels_in(lambda: steps.run(prompt + [7], 1))
    for layer, hook in zip(model.layers, hooks):
        layer.decode_layer_fn = hook
    steps = Steps(model, "cuda")
    steps.run(prompt, len(prompt))
    fused_kernels = kernels_in(lambda: steps.run(prompt + [7], 1))
    assert unfused_kernels - fused_kernels == 3 * arch.num_layers, (unfused_kernels, fused_kernels)
