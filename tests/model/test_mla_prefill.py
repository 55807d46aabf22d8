"""Latent attention's prompt chunks in the expanded form (``mla_prefill.expanded_prefill``, a GPU's
``LatentAttention.prefill_fn``) against the absorbed form over the same pool: a step mixing decodes, a prompt with
no cached prefix and chunks after cached ones gives the same values to float32 rounding (values padded to the key
width or not, an fp8 pool), the decodes taking the absorbed form; a step of short queries is left to the absorbed
form; and a tiny V3 with the hook installed generates the absorbed engine's tokens through chunked prefill."""
from __future__ import annotations

import functools

import pytest
import torch

from gh200rt.config import ModelConfig
from gh200rt.kv import fp8
from gh200rt.loader import load_model
from gh200rt.models.base import AttentionMetadata
from gh200rt.models.layers.mla import LatentAttention
from gh200rt.models.layers.mla_prefill import expanded_prefill
from gh200rt.sampling_params import SamplingParams
from tests.engine.real_models import SharedModel
from tests.model.tiny_checkpoints import save_tiny
from tests.speculative.test_spec_engine import looping_prompts


@pytest.fixture(scope="module")
def v3(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("mla-prefill") / "v3")
    save_tiny("deepseek-v3", path)
    return path


def step(attn: LatentAttention, query_lens, seq_lens, block_size=4, seed=0, pool_dtype=torch.float32):
    """Queries, a scattered one-plane pool holding every position's latent row, and the step's metadata."""
    gen = torch.Generator().manual_seed(seed)
    blocks = [-(-s // block_size) for s in seq_lens]
    ids = torch.randperm(sum(blocks) + 4, generator=gen)[:sum(blocks)].tolist()
    tables, at = [], 0
    for n in blocks:
        tables.append(ids[at:at + n])
        at += n
    width = attn.rank + attn.rope_dim
    pool = torch.randn(1, sum(blocks) + 4, block_size, 1, width, generator=gen)
    if pool_dtype != torch.float32:
        pool = (pool / 2).to(pool_dtype)
        attn.kv_scale.fill_(2.0)
    meta = AttentionMetadata.build(query_lens, seq_lens, tables, block_size)
    q_nope = torch.randn(meta.num_tokens, attn.num_heads, attn.nope_dim, generator=gen)
    q_pe = torch.randn(meta.num_tokens, attn.num_heads, attn.rope_dim, generator=gen)
    return q_nope, q_pe, pool, meta


@pytest.mark.parametrize("pad_values", [True, False])
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.float8_e4m3fn])
def test_the_expanded_form_gives_the_absorbed_values(v3, pad_values, pool_dtype):
    attn = load_model(ModelConfig(model=v3, dtype="float32")).model.layers[0].self_attn
    assert isinstance(attn, LatentAttention) and attn.prefill_fn is None
    # decodes, a whole prompt, chunks after cached prefixes of other lengths
    q_nope, q_pe, pool, meta = step(attn, [1, 9, 1, 20, 6], [13, 9, 30, 37, 11], pool_dtype=pool_dtype)
    want = attn.attend(q_nope, q_pe, pool, meta)
    got = expanded_prefill(attn, q_nope, q_pe, pool, meta, min_query=1, pad_values=pad_values)
    assert got.shape == want.shape == (meta.num_tokens, attn.num_heads, attn.v_dim)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    decodes = torch.tensor([0, 10])                # the decode rows take the absorbed form: the same sums
    torch.testing.assert_close(got[decodes], want[decodes], rtol=1e-6, atol=1e-6)
    assert expanded_prefill(attn, q_nope, q_pe, pool, meta, min_query=20) is None      # no chunk past 20 tokens
    one = step(attn, [12], [12], seed=1)           # a single prompt: the group is the whole step
    torch.testing.assert_close(expanded_prefill(attn, *one, min_query=4), attn.attend(*one), rtol=1e-5, atol=1e-5)
    attn.kv_scale.fill_(1.0)
    assert fp8.is_fp8(pool.dtype) == (pool_dtype != torch.float32)


def test_host_blocks_read_in_place_give_the_device_blocks_values(v3):
    """Tables naming host KV blocks (``meta.host_kv``): the expanded chunks gather them and the decodes attend them
    where they lie, with the bits of the same blocks in the device pool."""
    from gh200rt.kv.host_blocks import HostKVLayers
    from tests.kernels.test_host_block_attention import LAYER, LAYERS, MOVES, move_to_host
    attn = load_model(ModelConfig(model=v3, dtype="float32")).model.layers[0].self_attn
    q_nope, q_pe, pool, meta = step(attn, [1, 9, 1, 20, 6], [13, 9, 30, 37, 11])
    want = expanded_prefill(attn, q_nope, q_pe, pool, meta, min_query=1)
    host_meta, host, poisoned = move_to_host(pool, meta, MOVES["every other"])
    caches = [poisoned if layer == LAYER else torch.empty_like(poisoned) for layer in range(LAYERS)]
    host_meta.host_kv = HostKVLayers(caches, host.pool.transpose(0, 1).unsqueeze(1).expand(-1, LAYERS, -1, -1, -1, -1),
                                     host.first_id)
    got = expanded_prefill(attn, q_nope, q_pe, poisoned, host_meta, min_query=1)
    assert torch.equal(got, want)


def test_a_tiny_v3_with_the_hook_generates_the_absorbed_tokens(v3):
    shared = SharedModel(v3)
    prompts = looping_prompts(3, seed=9)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    options = dict(max_model_len=96, max_num_batched_tokens=24)       # chunked: chunks after cached prefixes
    want = [o.outputs[0].token_ids for o in shared.llm(**options).generate(prompts, params)]
    layers = [m for m in shared.model.modules() if isinstance(m, LatentAttention)]
    calls = []

    def counted(attn, *args):
        out = expanded_prefill(attn, *args, min_query=2)
        calls.append(out is not None)
        return out
    llm = shared.llm(**options)          # the CPU backend's hooks installed: none for prompt chunks
    assert all(attn.prefill_fn is None for attn in layers)
    try:
        for attn in layers:
            attn.prefill_fn = counted
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    finally:
        for attn in layers:
            attn.prefill_fn = None
    assert got == want
    assert any(calls) and not all(calls)          # chunks expanded, decode steps absorbed
