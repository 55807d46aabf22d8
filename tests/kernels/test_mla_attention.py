"""The latent-pool attention kernel (Triton, interpreted here) against the gather-then-attend torch reference, with the
one-plane pool read as K and as V (the stride-0 view the torch route takes); and a tiny DeepSeek-V3 decoding through
it (the CUDA backend's ops installed under the interpreter) with the torch route's tokens."""
import pytest
import torch

from gh200rt.kernels.triton.mla_attention import mla_attention, row_split
from gh200rt.kernels.triton.paged_attention import reference_paged_attention
from tests.kernels.paged_cases import scattered_case

pytestmark = pytest.mark.interpreter


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("query_lens,seq_lens", [([1, 1, 1], [1, 17, 40]), ([5, 1, 20], [37, 16, 20])])
@pytest.mark.parametrize("heads,d,block_size", [(20, 48, 16), (3, 40, 8)])
def test_latent_attention_matches_the_reference(dtype, query_lens, seq_lens, heads, d, block_size):
    """48 = a latent of 32 and a rotary key of 16 (the tiny V3's row); 40 leaves a rest of 8 padded to the dot's 16;
    20 heads take two head tiles, the second part-filled."""
    q, pool, meta, _ = scattered_case(query_lens, seq_lens, heads, 1, d, block_size, dtype, seed=d + heads)
    plane = pool[0]
    scale = d ** -0.5
    got = mla_attention(q, plane, meta, scale)
    want = reference_paged_attention(q, plane.expand(2, *plane.shape), meta, scale, 1)
    err = (got.float() - want.float()).abs().max().item()
    assert err < {torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype], err


def test_an_fp8_pool_is_read_with_its_scale():
    q, pool, meta, _ = scattered_case([1, 3], [9, 30], 4, 1, 48, 16, torch.float32, seed=3)
    plane = (pool[0] / 2).to(torch.float8_e4m3fn)
    kv_scale = torch.tensor([2.0, 2.0])
    got = mla_attention(q, plane, meta, 0.2, kv_scale)
    want = reference_paged_attention(q, plane.expand(2, *plane.shape), meta, 0.2, 1, kv_scale)
    assert (got - want).abs().max().item() < 1e-5


def test_the_row_splits_at_its_largest_power_of_two():
    assert row_split(576) == (512, 64) and row_split(48) == (32, 16) and row_split(40) == (32, 16)
    assert row_split(64) == (64, 16)          # nothing left: a masked 16-wide rest


def test_a_tiny_deepseek_v3_decodes_through_the_latent_kernel(tmp_path, monkeypatch):
    """The CUDA backend's ops installed on the tiny V3 (under the interpreter): decode steps take the latent kernel,
    and the greedy tokens and logits are the torch route's (float32 pool: exact dots, summation order apart)."""
    from gh200rt.backends.cuda.ops import install_triton_kernels
    from gh200rt.config import ModelConfig
    from gh200rt.kernels.triton import mla_attention as kernel
    from gh200rt.loader import load_model
    from tests.model.paged_runner import PagedRunner
    from tests.model.test_parity_tiny import prompt
    from tests.model.tiny_checkpoints import save_tiny
    path = str(tmp_path / "v3")
    save_tiny("deepseek-v3", path)
    model = load_model(ModelConfig(model=path, dtype="float32")).model
    want_tokens, want = PagedRunner(model, block_size=4, num_blocks=40).greedy(prompt()[:6], 3)
    calls = []
    real = kernel.mla_attention
    monkeypatch.setattr(kernel, "mla_attention", lambda q, *a, **kw: calls.append(q.shape[0]) or real(q, *a, **kw))
    install_triton_kernels(model)
    tokens, got = PagedRunner(model, block_size=4, num_blocks=40).greedy(prompt()[:6], 3)
    assert calls and all(n <= 16 for n in calls)          # decode steps (and the 6-token prompt) took it
    assert tokens == want_tokens
    assert (got - want).abs().max().item() < 1e-4 * want.abs().max().item()


@pytest.mark.parametrize("splits", [2, 3, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_contexts_combine_to_the_reference(splits, dtype):
    """Shares of each token's context (7 leaves the short contexts' later shares empty) combine to what one pass
    and the reference give."""
    q, pool, meta, _ = scattered_case([1, 1, 4], [3, 45, 33], 20, 1, 48, 8, dtype, seed=splits)
    plane = pool[0]
    want = reference_paged_attention(q, plane.expand(2, *plane.shape), meta, 0.15, 1)
    got = mla_attention(q, plane, meta, 0.15, num_splits=splits)
    one = mla_attention(q, plane, meta, 0.15, num_splits=1)
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    assert got.dtype == dtype and (got.float() - want.float()).abs().max().item() < tolerance
    assert (got.float() - one.float()).abs().max().item() < tolerance


def test_split_shares_of_an_fp8_pool_read_it_with_its_scale():
    q, pool, meta, _ = scattered_case([1, 2], [40, 21], 4, 1, 48, 8, torch.float32, seed=5)
    plane = (pool[0] / 2).to(torch.float8_e4m3fn)
    kv_scale = torch.tensor([2.0, 2.0])
    got = mla_attention(q, plane, meta, 0.2, kv_scale, num_splits=3)
    want = reference_paged_attention(q, plane.expand(2, *plane.shape), meta, 0.2, 1, kv_scale)
    assert (got - want).abs().max().item() < 1e-5


def test_latent_splits_fill_the_gpu_at_small_batches_only():
    from gh200rt.kernels.triton.mla_attention import latent_splits
    # V3's 128 heads: 8 head tiles a token; a 4096-token table (256 blocks of 16)
    assert latent_splits(1, 128, 256, 16) == 16          # 8 programs -> 66 wanted, shares of 256 tokens cap it
    assert latent_splits(1, 128, 2048, 16) == 66          # a 32k table: 528 programs (the GPU's target) bound it
    assert latent_splits(64, 128, 256, 16) == 1           # 512 programs: no split
    assert latent_splits(1, 128, 8, 16) == 1              # 128 tokens: never shorter shares than 256
