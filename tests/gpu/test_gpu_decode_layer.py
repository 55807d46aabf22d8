"""The one-row decode layer in six launches (backends/cuda/decode_layer.py) compiled on CUDA: the op-by-op Triton
path's logits (float32 to 1e-5; bfloat16 teacher-forced to a few units of the last place, the same greedy
tokens), taken on every decode step, and three launches fewer per layer and step (nine op by op, where the
residual add at a layer boundary is fused into the next norm)."""
import pytest
import torch

from gh200rt.backends.cuda.ops import use_triton_kernels
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



def batch_decode(model, rows: int, steps: int, fused_rows: int, pdl: bool = False) -> tuple[torch.Tensor, int]:
    """``rows`` sequences prefilled op by op, then ``steps`` greedy decode steps of all of them with layers fused up
    to ``fused_rows`` rows: every decode step's logits, and the kernels the last step launched (counted on a rerun
    of it: the same K/V land in the same slots)."""
    from gh200rt.models.base import AttentionMetadata
    from tests.gpu.gpu_models import BLOCK
    use_triton_kernels(model, fused_decode_rows=fused_rows, pdl=pdl)
    arch = model.arch
    kv = [torch.zeros(2, 4 * rows + 1, BLOCK, arch.num_kv_heads, arch.head_dim, dtype=model.dtype, device="cuda")
          for _ in range(arch.num_layers)]
    tables = [[1 + 4 * r + b for b in range(4)] for r in range(rows)]
    prompts = [[(31 * i + 7 * r + 5) % arch.vocab_size for i in range(5 + 3 * r)] for r in range(rows)]
    lens = [len(p) for p in prompts]

    @torch.inference_mode()
    def run(ids: list[int], query_lens: list[int]) -> torch.Tensor:
        meta = AttentionMetadata.build(query_lens, lens, tables, BLOCK, "cuda")
        return model.compute_logits(model(torch.tensor(ids, device="cuda"), meta.positions("cuda"), meta, kv))

    last = run(sum(prompts, []), lens)[torch.tensor(lens).cumsum(0) - 1]
    logits = []
    for _ in range(steps):
        ids = last.argmax(-1).tolist()
        lens = [n + 1 for n in lens]
        last = run(ids, [1] * rows)
        logits.append(last)
    return torch.cat(logits), kernels_in(lambda: run(ids, [1] * rows))


@pytest.mark.parametrize("rows", [2, 8])
def test_fused_rows_decode_steps_match_op_by_op_in_fewer_launches(rows):
    """``--fused-decode-rows``: a batch's decode steps run each layer in six launches (kernels/triton/fused_rows.py for the
    products) with the op-by-op path's greedy tokens and logits to a few units of bf16's last place."""
    arch = tiny_arch()
    model = tiny_model(arch, torch.bfloat16, "cuda")
    fused, fused_kernels = batch_decode(model, rows, 4, fused_rows=8)
    op_by_op, unfused_kernels = batch_decode(model, rows, 4, fused_rows=1)
    err = ((fused.float() - op_by_op.float()).abs().max() / op_by_op.float().abs().max()).item()
    print(f"{rows} rows: fused vs op by op, worst relative logit difference {err:.2e}; kernels {fused_kernels} vs "
          f"{unfused_kernels}")
    assert err <= 2 ** -6
    assert torch.equal(fused.argmax(-1), op_by_op.argmax(-1))
    assert unfused_kernels - fused_kernels >= 3 * arch.num_layers, (unfused_kernels, fused_kernels)


@pytest.mark.parametrize("rows", [1, 8])
def test_programmatic_dependent_launch_keeps_every_bit(rows):
    """``--enable-pdl``: each kernel waits for the one before it before touching memory, so the decode steps'
    logits are bit for bit those of ordinary launches (a kernel reading a buffer before its producer finished would
    show here), in the same number of launches."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90+")
    arch = tiny_arch(qk_norm=True)
    model = tiny_model(arch, torch.bfloat16, "cuda")
    plain, plain_kernels = batch_decode(model, rows, 6, fused_rows=8)
    chained, chained_kernels = batch_decode(model, rows, 6, fused_rows=8, pdl=True)
    assert torch.equal(chained, plain)
    assert chained_kernels == plain_kernels
