"""The fp16+gguf resident form (``cpu_prepack.OneRowBlocksWeight``): on the fp16 CPU route, a GGUF checkpoint's
linears keep their Q4_1 / Q8_0 blocks for single rows (one sequence decoding, through the native quantized
linear) beside the fp16 weight that serves batches. The route is forced here (``--cpu-route fp16``), so the test
runs on any CPU with fbgemm and a C compiler; on an AVX2 CPU without native bf16 it is what ``--dtype auto``
picks."""
import pytest
import torch

from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.kernels.cpu_native import load_native_ops, native_ops_error
from gh200rt.kernels.quant import HalfWeight, PackedWeight, quantize_int4
from gh200rt.models.layers.cpu_prepack import OneRowBlocksWeight, linear_formats
from gh200rt.platform.cpu_features import route_unavailable
from gh200rt.sampling_params import SamplingParams

pytestmark = [pytest.mark.skipif(load_native_ops() is None, reason=f"no native CPU kernels: {native_ops_error()}"),
              pytest.mark.skipif(route_unavailable("fp16") is not None,
                                 reason=f"the fp16 route cannot execute here: {route_unavailable('fp16')}")]
PROMPTS = [[1, 9690, 2114, 30], [1, 504, 3458], list(range(400, 430))]
PARAMS = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


def smollm2(**options) -> LLMEngine:
    """SmolLM2 (the shipped Q4_1 GGUF) on the fp16 route whatever this CPU's default."""
    return LLMEngine.from_config(EngineConfig.from_kwargs(model="smollm2-135m", cpu_route="fp16", max_model_len=256,
                                                          **options))


def tokens(eng: LLMEngine, prompts) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in LLM.from_engine(eng).generate(prompts, PARAMS)]


@pytest.fixture(scope="module")
def reference():
    eng = LLMEngine.from_config(EngineConfig.from_kwargs(model="smollm2-135m", dtype="float32", max_model_len=256))
    try:
        return [tokens(eng, [p])[0] for p in PROMPTS]
    finally:
        eng.close()


def test_every_linear_keeps_its_blocks_for_single_rows(reference):
    eng = smollm2()
    try:
        assert linear_formats(eng.runner.model) == {"OneRowBlocksWeight": 121}   # 30 x 4 decoder linears + lm_head
        head = eng.runner.model.lm_head.weight_ref.current
        assert head.blocks.fmt == "int8" and head.blocks.shape == (49152, 576)   # the tied embedding's Q8_0 blocks
        # one sequence at a time decodes through the blocks, three together through fp16: both give fp32's tokens
        assert [tokens(eng, [p])[0] for p in PROMPTS] == reference
        assert tokens(eng, PROMPTS) == reference
    finally:
        eng.close()


def blocks_bytes(model) -> int:
    refs = [ref for i in range(len(model.layers)) for ref in model.layer_weight_refs(i).values()]
    return sum(ref.current.blocks.nbytes for ref in refs + [model.lm_head.weight_ref]
               if isinstance(ref.current, OneRowBlocksWeight))


def test_the_blocks_are_booked_and_planned():
    """The blocks sit beside the fp16 forms (which take the resident layers' booked bytes): the ledger books
    exactly the blocks the model holds, and under a budget the planner counts them, streaming layers."""
    resident = smollm2(offload="none")
    blocks = blocks_bytes(resident.runner.model)
    assert blocks > 0 and resident.ledger.by_kind["cpu_route_forms"] == blocks
    assert resident.ledger.used <= resident.ledger.capacity
    kv_room = 64 * resident.store.arena.block_bytes
    budget = resident.ledger.used - resident.ledger.by_kind["kv_pool"] - blocks // 2 + kv_room
    resident.close()
    tight = smollm2(device_memory_budget=budget)
    try:
        tiers = tight.stats().layers_per_tier
        assert tiers.get("streamed", 0) + tiers.get("direct", 0) >= 1, tiers
        assert tight.ledger.by_kind["cpu_route_forms"] == blocks_bytes(tight.runner.model) < blocks
        assert tight.ledger.used <= budget
    finally:
        tight.close()


def test_torch_kernels_keep_the_plain_fp16_form():
    eng = smollm2(cpu_kernels="torch")
    try:
        assert linear_formats(eng.runner.model) == {"HalfWeight": 121}
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
