"""The GGUF row forms (``prepack.OneRowBlocksWeight``): on the fp16 and bf16 CPU routes, a GGUF checkpoint's
linears keep their Q4_1 / Q8_0 blocks for single rows (one sequence decoding, through the native quantized
linear) beside the route's batch form (fp16 for ``fp16+gguf``, oneDNN's reordered bf16 for ``onednn-bf16+gguf``, the
AMX tile layout for ``amx-bf16+gguf``).
Each route is forced here (``--cpu-route``), so the test runs wherever the route executes; ``--dtype auto`` picks
fp16 on an AVX2 CPU without native bf16, bf16 on one with it."""
import pytest
import torch

from gh200rt.backends.cpu.native import load_native_ops, native_ops_error
from gh200rt.backends.cpu.prepack import (OneDNNWeight, OneRowBlocksWeight, amx_available, bf16_dot_available,
                                          linear_formats)
from gh200rt.backends.cpu.routes import route_unavailable
from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.formats.pack import HalfWeight, PackedWeight, quantize_int4
from gh200rt.sampling_params import SamplingParams
from tests.cpu_routes import TEST_ROUTES, native_build
from tests.engine.real_models import assert_same_or_near_tie

pytestmark = pytest.mark.skipif(load_native_ops() is None, reason=f"no native CPU kernels: {native_ops_error()}")
PROMPTS = [[1, 9690, 2114, 30], [1, 504, 3458], list(range(400, 430))]
PARAMS = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
BATCH_FORMS = {"fp16": "HalfWeight", "bf16": "OneDNNWeight"}    # route -> the form beside the blocks (torch kernels)
# bf16 activations pick a token other than fp32's only where fp32's top two are this close in logprob (the
# route parity bound of tests/model/test_cpu_route_parity.py: 0.5 below fp32's best)
BF16_TIE_GAP = 0.5


@pytest.fixture(params=["bf16", "bf16-no-amx", "fp16"])
def route(request) -> str:
    """The ``--cpu-route`` a test forces (``bf16-no-amx``: the bf16 route over a native build without AMX, as a CPU
    with AVX-512 BF16 and no AMX runs it: the dot-product kernel beside the blocks)."""
    test_route = TEST_ROUTES[request.param]
    why_not = test_route.unavailable()
    if why_not is not None:
        pytest.skip(f"the {request.param} route cannot execute here: {why_not}")
    if test_route.portable:
        with native_build(test_route.native_flags):
            yield test_route.cpu_route
    else:
        yield test_route.cpu_route


def native_batch_form(route: str) -> str:
    """The form beside the blocks with the native kernels on: on the bf16 route the AMX tile layout where AMX runs,
    else the same layout on AVX-512 BF16 dot products where the build has them."""
    if route == "bf16" and amx_available():
        return "AmxWeight"
    return "Bf16DotWeight" if route == "bf16" and bf16_dot_available() else BATCH_FORMS[route]


def smollm2(model: str, route: str, **options) -> LLMEngine:
    """SmolLM2 (``model``: the shipped Q4_1 GGUF's first four blocks, the short_smollm2 fixture) on ``route``
    whatever this CPU's default."""
    return LLMEngine.from_config(EngineConfig.from_kwargs(model=model, cpu_route=route, max_model_len=256, **options))


def generate(eng: LLMEngine, prompts, params=PARAMS):
    return LLM.from_engine(eng).generate(prompts, params)


def tokens(eng: LLMEngine, prompts) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in generate(eng, prompts)]


@pytest.fixture(scope="module")
def reference(short_smollm2):
    """fp32's outputs, one prompt at a time, with the top-2 logprobs a near tie is judged by."""
    eng = LLMEngine.from_config(EngineConfig.from_kwargs(model=short_smollm2, dtype="float32", max_model_len=256))
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=2)
    try:
        return [generate(eng, [p], params)[0] for p in PROMPTS]
    finally:
        eng.close()


def assert_close_to_fp32(route: str, reference, outputs, label: str) -> None:
    if route == "fp16":      # fp32 activations: fp32's tokens exactly
        assert [list(o.outputs[0].token_ids) for o in outputs] == [list(r.outputs[0].token_ids) for r in reference]
    else:
        assert_same_or_near_tie(reference, outputs, label, tie_gap=BF16_TIE_GAP)


def test_every_linear_keeps_its_blocks_for_single_rows(reference, route, short_smollm2):
    eng = smollm2(short_smollm2, route)
    try:
        assert linear_formats(eng.runner.model) == {"OneRowBlocksWeight": 17}   # 4 x 4 decoder linears + lm_head
        head = eng.runner.model.lm_head.weight_ref.current
        assert head.blocks.fmt == "int8" and head.blocks.shape == (49152, 576)   # the tied embedding's Q8_0 blocks
        assert type(head.batch).__name__ == native_batch_form(route)
        # one sequence at a time decodes through the blocks, three together through the batch form
        assert_close_to_fp32(route, reference, [generate(eng, [p])[0] for p in PROMPTS], f"{route}, one at a time")
        assert_close_to_fp32(route, reference, generate(eng, PROMPTS), f"{route}, batched")
    finally:
        eng.close()


def blocks_bytes(model) -> int:
    refs = [ref for i in range(len(model.layers)) for ref in model.layer_weight_refs(i).values()]
    return sum(ref.current.blocks.nbytes for ref in refs + [model.lm_head.weight_ref]
               if isinstance(ref.current, OneRowBlocksWeight))


def test_the_blocks_are_booked_and_planned(route, short_smollm2):
    """The blocks sit beside the batch forms (which take the resident layers' booked bytes): the ledger books
    exactly the blocks the model holds, and under a budget the planner counts them, streaming layers."""
    resident = smollm2(short_smollm2, route, offload="none")
    blocks = blocks_bytes(resident.runner.model)
    assert blocks > 0 and resident.ledger.by_kind["cpu_route_forms"] == blocks
    assert resident.ledger.used <= resident.ledger.capacity
    kv_room = 64 * resident.store.arena.block_bytes
    budget = resident.ledger.used - resident.ledger.by_kind["kv_pool"] - blocks // 2 + kv_room
    resident.close()
    tight = smollm2(short_smollm2, route, device_memory_budget=budget)
    try:
        tiers = tight.stats().layers_per_tier
        assert tiers.get("streamed", 0) + tiers.get("direct", 0) >= 1, tiers
        assert tight.ledger.by_kind["cpu_route_forms"] == blocks_bytes(tight.runner.model) < blocks
        assert tight.ledger.used <= budget
    finally:
        tight.close()


def test_torch_kernels_keep_the_plain_batch_form(route, short_smollm2):
    eng = smollm2(short_smollm2, route, cpu_kernels="torch")
    try:
        assert linear_formats(eng.runner.model) == {BATCH_FORMS[route]: 17}
        assert eng.ledger.by_kind["cpu_route_forms"] == 0
    finally:
        eng.close()


def test_one_row_takes_the_blocks_and_more_rows_the_batch_form():
    gen = torch.Generator().manual_seed(0)
    dense = torch.randn(64, 96, generator=gen)
    blocks, half = quantize_int4(dense, 32), HalfWeight(dense.half())
    both = OneRowBlocksWeight(blocks, half)
    one, three = torch.randn(1, 96, generator=gen), torch.randn(3, 96, generator=gen)
    assert torch.equal(both.linear(one), blocks.linear(one))
    assert torch.equal(both.linear(one[0]), blocks.linear(one[0]))          # a bare vector is one row too
    assert torch.equal(both.linear(three), half.linear(three))
    assert both.nbytes == blocks.nbytes + half.nbytes
    with pytest.raises(AssertionError):
        OneRowBlocksWeight(PackedWeight("int8", torch.zeros(8, 96, dtype=torch.int8), torch.ones(8, 3), None, 32,
                                        (8, 96)), half)


@pytest.mark.skipif(route_unavailable("bf16") is not None, reason=f"the bf16 route's oneDNN weights: "
                                                                   f"{route_unavailable('bf16')}")
def test_a_bf16_row_takes_the_blocks_widened_and_rounds_back():
    gen = torch.Generator().manual_seed(0)
    dense = torch.randn(64, 96, generator=gen)
    blocks, reordered = quantize_int4(dense, 32), OneDNNWeight(dense.bfloat16())
    both = OneRowBlocksWeight(blocks, reordered)
    one, three = torch.randn(1, 96, generator=gen).bfloat16(), torch.randn(3, 96, generator=gen).bfloat16()
    got = both.linear(one)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, blocks.linear(one.float()).bfloat16())
    assert torch.equal(both.linear(three), reordered.linear(three))
