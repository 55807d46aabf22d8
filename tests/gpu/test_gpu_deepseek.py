"""Tiny DeepSeek-V3 and GLM-4.5 models on CUDA under the GPU engine, decode graphs included, with experts resident,
read in place and streamed; GLM's partly rotated heads on the Triton kernels: transformers' greedy tokens in float32
(or a first difference at a near tie); and the latent kernel split over a long context at V3's width."""
import pytest
import torch

from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.sampling_params import SamplingParams
from tests.engine.test_deepseek_engine import GREEDY, PROMPTS, v3  # noqa: F401  (the module's fixture)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("label,options", [("resident", dict(offload="none")),
                                           ("experts direct", dict(offload="none", moe_expert_tier="direct")),
                                           ("experts streamed", dict(offload="none", moe_expert_tier="stream"))])
def test_greedy_tokens_equal_transformers_on_cuda(v3, label, options):  # noqa: F811
    path, want = v3
    config = EngineConfig.from_kwargs(model=path, dtype="float32", max_model_len=64, num_kv_blocks=64, **options)
    engine = LLMEngine.from_config(config, poison=True)
    try:
        assert engine.runner.device == "cuda" and torch.cuda.is_available()
        got = [o.outputs[0].token_ids for o in LLM.from_engine(engine).generate(PROMPTS, GREEDY)]
    finally:
        engine.close()
    first_difference = [next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), None) for g, w in zip(got, want)]
    assert all(d is None or d >= 4 for d in first_difference), (label, got, want)


def test_glm4_moe_with_partial_rotary_on_cuda(tmp_path):
    """GLM-4.5's shape (RoPE over half of each head, q/k norm) through the Triton kernels: the partly rotated heads
    take the op-by-op path (the fused RoPE + store step rotates whole heads); transformers' greedy tokens."""
    from tests.model.test_parity_tiny import prompt
    from tests.model.tiny_checkpoints import save_tiny
    path = str(tmp_path / "glm")
    hf = save_tiny("glm4-moe-qk-norm", path)
    prompts = [prompt(1)[:20], prompt(2)[:13]]
    with torch.no_grad():
        want = [hf.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, eos_token_id=None,
                            pad_token_id=0)[0, len(ids):].tolist() for ids in prompts]
    config = EngineConfig.from_kwargs(model=path, dtype="float32", max_model_len=64, num_kv_blocks=64)
    engine = LLMEngine.from_config(config, poison=True)
    try:
        assert engine.runner.device == "cuda"
        got = [o.outputs[0].token_ids for o in LLM.from_engine(engine).generate(
            prompts, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))]
    finally:
        engine.close()
    first_difference = [next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), None) for g, w in zip(got, want)]
    assert all(d is None or d >= 4 for d in first_difference), (got, want)


def test_the_latent_kernel_split_over_a_long_context_gives_the_one_pass_values():
    """V3's rows (576 wide, 128 heads) over 2-3k-token contexts, compiled: split-K (the default at batch 2) against
    one pass, bf16, and against the gather-then-attend reference in float32."""
    from gh200rt.kernels.triton.mla_attention import latent_splits, mla_attention
    from gh200rt.kernels.triton.paged_attention import reference_paged_attention
    from gh200rt.models.base import AttentionMetadata
    from tests.kernels.paged_cases import scattered_case
    q, pool, cpu_meta, _ = scattered_case([1, 1], [2048, 3000], 128, 1, 576, 16, torch.bfloat16, seed=0)
    tables = [row[:-(-n // 16)] for row, n in zip(cpu_meta.block_tables.tolist(), [2048, 3000])]
    meta = AttentionMetadata.build([1, 1], [2048, 3000], tables, 16, "cuda")
    q, plane = q.cuda(), pool[0].cuda()
    assert latent_splits(2, 128, meta.block_tables.shape[1], 16) > 1
    split = mla_attention(q, plane, meta, 576 ** -0.5)
    one = mla_attention(q, plane, meta, 576 ** -0.5, num_splits=1)
    want = reference_paged_attention(q.float(), plane.float().expand(2, *plane.shape), meta, 576 ** -0.5, 1)
    assert (split.float() - one.float()).abs().max().item() < 2e-2
    assert (split.float() - want).abs().max().item() < 2e-2
