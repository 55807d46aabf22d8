"""A tiny DeepSeek-V3 through the whole engine on the CPU: transformers' greedy tokens whatever the experts' and the
layers' tier, the latent pool in every form the engine keeps it (fp8, the host KV tier loaded or read in place, bf16
on the native kernels), and what the engine refuses for it."""
from __future__ import annotations

import pytest
import torch

from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.sampling_params import SamplingParams
from tests.engine.route_engines import describe_difference, first_step_logits
from tests.engine.test_host_kv_tier import conversations, synchronous_stores, talk
from tests.model.test_parity_tiny import prompt
from tests.model.tiny_checkpoints import save_tiny

PROMPTS = [prompt(1)[:20], prompt(2)[:13], prompt(1)[:20] + prompt(3)[:6]]
GREEDY = SamplingParams(max_tokens=10, temperature=0.0)


@pytest.fixture(scope="module")
def v3(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("deepseek-v3-engine"))
    hf = save_tiny("deepseek-v3", path)
    with torch.no_grad():
        want = [hf.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False)[0, len(ids):].tolist()
                for ids in PROMPTS]
    return path, want


def _tokens(path: str, params: SamplingParams = GREEDY, **options) -> list[list[int]]:
    config = EngineConfig.from_kwargs(model=path, **{"dtype": "float32", "max_model_len": 64, **options})
    engine = LLMEngine.from_config(config, poison=True)
    try:
        return [o.outputs[0].token_ids for o in LLM.from_engine(engine).generate(PROMPTS, params)]
    finally:
        engine.close()


@pytest.mark.parametrize("label,options", [
    ("resident", dict(offload="none")),
    ("experts direct", dict(offload="none", moe_expert_tier="direct")),
    ("experts streamed", dict(offload="none", moe_expert_tier="stream")),
    ("layers streamed", dict(offload="stream", staging_slots=2, prefetch_distance=1)),
    ("dynamic tiers", dict(offload="dynamic")),
    ("torch kernels", dict(offload="none", cpu_kernels="torch")),
])
def test_greedy_tokens_equal_transformers_in_every_tier(v3, label, options):
    path, want = v3
    assert _tokens(path, **options) == want, label


def test_the_host_kv_tier_brings_latent_blocks_back(v3):
    """Conversations whose blocks a small pool cannot keep: their second turns find them in the host tier (one plane
    per block) and give what a pool that kept them gives, tokens and logprobs."""
    path, _ = v3
    firsts = conversations(256, count=3, system=0)

    def llm(**options):
        config = EngineConfig.from_kwargs(model=path, dtype="float32", max_model_len=128, offload="none", **options)
        return LLM.from_engine(LLMEngine.from_config(config, poison=True))
    big = llm(num_kv_blocks=64)
    want = talk(big, firsts, turns=2, max_tokens=2)
    big.engine.close()
    small = llm(num_kv_blocks=8, kv_offloading_size="16MiB", kv_offloading_reads="load")
    try:
        got = talk(small, firsts, turns=2, max_tokens=2)
        host = small.engine.stats().kv_host
    finally:
        small.engine.close()
    assert got == want
    assert host.hit_tokens >= 2 * 48 and host.loaded_blocks >= 6, host


@pytest.mark.parametrize("kernels", ["torch", "native"])
def test_latent_blocks_read_in_place_give_a_loads_bits(v3, kernels):
    """The same conversations with the host tier's latent blocks read in place by the attention (absorbed form: the
    one-plane pool seen as K and V; the torch gather, or the native kernels' second pool) instead of loaded: the same
    tokens and logprobs, no load."""
    path, _ = v3
    firsts = conversations(256, count=3, system=0)
    seen, host = {}, None
    for reads in ("load", "in_place"):
        config = EngineConfig.from_kwargs(model=path, dtype="float32", max_model_len=128, offload="none",
                                          cpu_kernels=kernels, num_kv_blocks=8, kv_offloading_size="16MiB",
                                          kv_offloading_reads=reads)
        llm = LLM.from_engine(LLMEngine.from_config(config, poison=True))
        synchronous_stores(llm)
        try:
            seen[reads] = talk(llm, firsts, turns=2, max_tokens=2)
            host = llm.engine.stats().kv_host
        finally:
            llm.engine.close()
    assert seen["in_place"] == seen["load"]
    assert host.read_in_place_blocks >= 3 and host.loaded_blocks == 0, host


def test_an_fp8_latent_pool_and_the_bf16_route_generate(v3):
    """fp8 latent rows (one scale read as K and as V) and bf16 on the native kernels: close to float32, not bit-equal;
    each generates a full answer and agrees with float32 on the first tokens."""
    path, want = v3
    for options in (dict(kv_cache_dtype="fp8"), dict(dtype="bfloat16")):
        got = _tokens(path, SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True), offload="none",
                      **options)
        assert all(len(g) == 10 for g in got)
        assert sum(g[:2] == w[:2] for g, w in zip(got, want)) >= 2, (options, got, want)


def test_every_cpu_route_gets_a_cold_prefills_bits_after_a_cached_prefix(v3, cpu_route):
    """Latent attention keeps the prefix-cache invariance on every route: a prompt's first-token logits, bit for
    bit, cold, after two of its blocks from the prefix cache (the absorption products in the step's row blocks), and
    in prefill chunks of 7 tokens."""
    path, _ = v3
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    prompt_ids = prompt(4)[:45]

    def route_llm(**options):
        config = EngineConfig.from_kwargs(model=path, max_model_len=64, num_kv_blocks=32, offload="none",
                                          **cpu_route.options, **options)
        return LLM.from_engine(LLMEngine.from_config(config))
    cold = route_llm(enable_prefix_caching=False)
    want_tokens, want = first_step_logits(cold, prompt_ids, params)
    cold.engine.close()
    warm = route_llm()
    warm.generate([prompt_ids[:33]], SamplingParams(temperature=0, max_tokens=1))     # publishes two blocks
    hits = warm.engine.stats().prefix_cache_hit_tokens
    got_tokens, got = first_step_logits(warm, prompt_ids, params)
    assert warm.engine.stats().prefix_cache_hit_tokens - hits == 32
    warm.engine.close()
    label = f"{cpu_route.name}: after 2 cached blocks"
    assert torch.equal(got, want), f"{label}: {describe_difference(got, want)}"
    assert got_tokens == want_tokens, label
    chunked = route_llm(enable_prefix_caching=False, max_num_batched_tokens=7)
    got_tokens, got = first_step_logits(chunked, prompt_ids, params)
    chunked.engine.close()
    label = f"{cpu_route.name}: in chunks of 7"
    assert torch.equal(got, want), f"{label}: {describe_difference(got, want)}"
    assert got_tokens == want_tokens, label


def test_int4_g128_host_weights_serve_in_every_offloaded_tier(v3):
    """``--host-weight-dtype int4-g128`` (4.5 bits a weight: what lets DeepSeek-V3's experts fit a GH200's host
    memory): streamed and direct layers, and experts read in place, compute from the same host forms, so they give
    the same tokens; the layers' slabs hold int4 in groups of 128 columns."""
    path, _ = v3
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    runs = {}
    for label, options in {"stream": dict(offload="stream", staging_slots=2, prefetch_distance=1),
                           "direct": dict(offload="direct")}.items():
        config = EngineConfig.from_kwargs(model=path, dtype="float32", max_model_len=64, num_kv_blocks=32,
                                          host_weight_dtype="int4-g128", **options)
        engine = LLMEngine.from_config(config, poison=True)
        try:
            runs[label] = [o.outputs[0].token_ids for o in LLM.from_engine(engine).generate(PROMPTS, params)]
            form = engine.store.slabs[1].layout.forms["self_attn.q_b_proj"]
            assert form.fmt == "int4" and form.group_size == 128, form
        finally:
            engine.close()
    assert runs["stream"] == runs["direct"]
