"""Embeddings against a pooled transformers reference: ``AutoModel``'s last hidden state (after the final norm) of a
tiny random checkpoint in float32, pooled by last token and by mean, L2-normalised, as ``LLM.embed`` returns them.
One dense and one MoE family; a prompt prefilled in chunks beside generation requests pools the same."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gh200rt.pooling_params import PoolingParams
from gh200rt.sampling_params import SamplingParams
from tests.engine.real_models import SharedModel
from tests.model.tiny_checkpoints import VOCAB, save_tiny

LENGTHS = (1, 7, 40)


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in LENGTHS]


@torch.no_grad()
def reference(path: str, ids: list[int], pooling: str, normalize: bool = True) -> torch.Tensor:
    from transformers import AutoModel
    hidden = AutoModel.from_pretrained(path, dtype=torch.float32).eval()(torch.tensor([ids])).last_hidden_state[0]
    pooled = hidden[-1] if pooling == "LAST" else hidden.mean(0)
    return F.normalize(pooled, dim=-1) if normalize else pooled


@pytest.fixture(scope="module", params=["llama3-gqa-untied", "qwen3-moe-norm"])
def checkpoint(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp(request.param))
    save_tiny(request.param, path)
    return request.param, path, SharedModel(path)


@pytest.mark.parametrize("pooling", ["LAST", "MEAN"])
def test_embed_matches_pooled_transformers(checkpoint, pooling):
    family, path, shared = checkpoint
    llm = shared.llm(pooling_type=pooling, max_model_len=64)
    ids = prompts()
    outs = llm.embed(ids)
    raw = llm.embed(ids, PoolingParams(normalize=False))
    for i, (out, plain) in enumerate(zip(outs, raw)):
        ours = torch.tensor(out.outputs.embedding)
        assert out.prompt_token_ids == ids[i] and ours.shape == (shared.arch.hidden_size,)
        for got, want in ((ours, reference(path, ids[i], pooling)),
                          (torch.tensor(plain.outputs.embedding), reference(path, ids[i], pooling, False))):
            err = float((got - want).abs().max() / want.abs().max())
            print(f"{family} {pooling} len {len(ids[i])}: worst relative error {err:.3g}")
            assert err <= 1e-4, f"{family} {pooling}: input of {len(ids[i])} tokens off by {err:.3g}"


@pytest.mark.parametrize("pooling", ["LAST", "MEAN"])
def test_chunked_and_mixed_with_generation_pool_the_same(checkpoint, pooling):
    """Alone in one step vs in chunks of 6 tokens beside two generation requests: LAST is bit-identical (each prompt
    position is computed alike however it is split or batched, on the CPU), MEAN within float32 rounding."""
    _family, _path, shared = checkpoint
    ids = prompts()[2]
    alone = torch.tensor(shared.llm(pooling_type=pooling, max_model_len=64).embed([ids])[0].outputs.embedding)
    llm = shared.llm(pooling_type=pooling, max_model_len=64, max_num_batched_tokens=6, enable_prefix_caching=False)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    engine.add_request("gen-0", None, params, prompt_token_ids=ids[:5])
    engine.add_request("emb", None, PoolingParams(), prompt_token_ids=ids)
    engine.add_request("gen-1", None, params, prompt_token_ids=ids[3:11])
    got, steps = None, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == "emb":
                got = torch.tensor(out.outputs.embedding)
        steps += 1
    assert got is not None and steps > len(ids) // 6
    assert engine.kv.pool.num_free == engine.kv.pool.num_blocks - engine.kv.pool.num_run_blocks   # nothing kept
    if pooling == "LAST":
        assert torch.equal(got, alone), float((got - alone).abs().max())
    else:
        assert torch.allclose(got, alone, rtol=0, atol=1e-6), float((got - alone).abs().max())


def test_prefix_cache_hit_pools_the_same(checkpoint):
    """A second LAST-pooled request reuses the first one's published blocks and pools the same vector."""
    _family, _path, shared = checkpoint
    llm = shared.llm(pooling_type="LAST", max_model_len=64, block_size=4)
    ids = prompts()[2]
    first = llm.embed([ids])[0].outputs.embedding
    hits = llm.engine.kv.stats.hits
    second = llm.embed([ids])[0].outputs.embedding
    assert llm.engine.kv.stats.hits == hits + 1
    assert first == second


def test_refusals(checkpoint):
    _family, _path, shared = checkpoint
    llm = shared.llm(max_model_len=16)
    with pytest.raises(ValueError, match="max_model_len is 16"):
        llm.embed([list(range(3, 20))])
    with pytest.raises(ValueError, match="cannot"):
        llm.embed([[3, 4]], PoolingParams(dimensions=8))
    assert len(llm.embed([[3, 4]], PoolingParams(dimensions=shared.arch.hidden_size))[0].outputs.embedding) == 64


def test_gguf_file_embeds_as_its_checkpoint(checkpoint, tmp_path):
    """The same MoE weights read from an F32 GGUF file (tokenizer and all) pool to the reference's vectors."""
    family, path, _shared = checkpoint
    if family != "qwen3-moe-norm":
        pytest.skip("the tiny GGUF writer covers the MoE families")
    pytest.importorskip("gguf")
    from tests.model.tiny_gguf import write_gguf
    gguf_path = str(tmp_path / "model.gguf")
    write_gguf(path, gguf_path, "F32")
    ids = prompts()[1]
    got = torch.tensor(SharedModel(gguf_path).llm(max_model_len=64).embed([ids])[0].outputs.embedding)
    want = reference(path, ids, "LAST")
    assert float((got - want).abs().max()) <= 1e-4
