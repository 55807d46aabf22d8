"""A refusal the engine gives names a budget the engine accepts: following the message (issue 27: "a budget of
730473968 bytes is refused again with the same text") places the model, and a byte less is refused with the same
minimum, on every CPU route and in every offload mode. What the planner books is what the ledger holds."""
import pytest

from gh200rt.config import EngineConfig
from gh200rt.engine.bootstrap import graph_pool_booking, load_and_place
from gh200rt.models.arch_config import ArchConfig
from gh200rt.planner.planner import PlanDoesNotFit
from tests.engine.real_models import save_tiny_llama
from tests.model.tiny_checkpoints import save_tiny

MODES = {
    "stream": dict(offload="stream"),
    "auto": dict(offload="auto"),
    "dynamic": dict(offload="dynamic"),
    "direct": dict(offload="direct"),
}


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """Linears large enough for oneDNN, so the fp32 route books reordered copies beside resident layers."""
    return save_tiny_llama(str(tmp_path_factory.mktemp("wide") / "wide"), vocab_size=512, num_layers=4,
                           hidden_size=512, intermediate_size=1024)


def place(model: str, budget: int, **options):
    config = EngineConfig.from_kwargs(model=model, max_model_len=128, device_memory_budget=budget, **options)
    return load_and_place(config)


@pytest.mark.parametrize("cpu_route", ["fp32", "fp16", "bf16"], indirect=True)
@pytest.mark.parametrize("mode", MODES)
def test_the_named_minimum_places_the_model_and_a_byte_less_is_refused(wide, cpu_route, mode):
    options = {**MODES[mode], **cpu_route.options}
    with pytest.raises(PlanDoesNotFit, match="smallest plan") as refused:
        place(wide, 1 << 20, **options)
    minimum = refused.value.minimum
    assert f"needs {minimum} bytes" in str(refused.value)
    placed = place(wide, minimum, **options)
    assert placed.ledger.peak <= placed.ledger.capacity == minimum
    assert placed.plan.num_kv_blocks * placed.plan.block_size >= 128     # one --max-model-len sequence
    placed.store.close()
    with pytest.raises(PlanDoesNotFit) as below:
        place(wide, minimum - 1, **options)
    assert below.value.minimum == minimum


@pytest.mark.parametrize("family,streamed", [("deepseek-v3", "1-2:streamed"), ("glm4-moe-qk-norm", "1-2:streamed"),
                                             ("qwen2-moe-shared", "0:streamed,2-3:streamed")])
def test_each_layer_kind_is_booked_at_its_own_size(tmp_path, family, streamed):
    """Models that mix a dense layer with sparse ones (whose routed experts are placed apart): the plan books each
    kind at its own size and the ledger agrees to the byte (the minimum a refusal names places the model with the
    sparse layers streamed beside the resident dense one, a byte less is refused); the ring, sized for the sparse
    layers, refuses to stream the larger dense one with a message that says how to start instead."""
    path = str(tmp_path / family)
    save_tiny(family, path)
    options = dict(model=path, dtype="float32", max_model_len=64, offload="none", layer_tiers=streamed)
    with pytest.raises(PlanDoesNotFit, match="smallest plan") as refused:
        load_and_place(EngineConfig.from_kwargs(device_memory_budget=1 << 20, **options))
    minimum = refused.value.minimum
    placed = load_and_place(EngineConfig.from_kwargs(device_memory_budget=minimum, **options))
    try:
        kinds = placed.plan.sizes.kinds
        dense = next(i for i, layer in enumerate(placed.plan.sizes.layers) if layer.kind == "dense")
        assert kinds["dense"].host_bytes > kinds["moe"].host_bytes
        assert placed.plan.slot_bytes == kinds["moe"].host_bytes == placed.store.backend.slots[0].nbytes
        assert placed.ledger.peak <= placed.ledger.capacity == minimum
        with pytest.raises(ValueError, match=f"layer {dense} cannot stream: its host form takes .* start with "
                                             "--offload dynamic"):
            placed.store.set_tier(dense, "streamed")
        assert placed.store.tiers[dense] == "resident"
    finally:
        placed.store.close()
    with pytest.raises(PlanDoesNotFit) as below:
        load_and_place(EngineConfig.from_kwargs(device_memory_budget=minimum - 1, **options))
    assert below.value.minimum == minimum


def test_the_plan_counts_the_decode_graph_pool_the_ledger_books():
    arch = ArchConfig("llama", hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4, num_kv_heads=2,
                      head_dim=64, vocab_size=300)
    config = EngineConfig.from_kwargs(max_num_seqs=32)
    assert graph_pool_booking(config, arch, "bf16", "cuda") > 0
    assert graph_pool_booking(config, arch, "bf16", "cpu") == 0
    assert graph_pool_booking(EngineConfig.from_kwargs(enforce_eager=True), arch, "bf16", "cuda") == 0


def test_the_cpu_default_budget_holds_the_kv_blocks_asked_for(tmp_path):
    """More KV blocks than every sequence at full length needs are useful (the prefix cache keeps freed blocks):
    without a budget, the CPU's default ledger holds what --num-kv-blocks asks for instead of refusing it."""
    from gh200rt.engine.engine import LLMEngine
    path = save_tiny_llama(str(tmp_path / "tiny"))
    config = EngineConfig.from_kwargs(model=path, dtype="float32", max_model_len=128, max_num_seqs=2,
                                      num_kv_blocks=200)      # 2 x 128 tokens need 16 blocks
    eng = LLMEngine.from_config(config)
    assert eng.stats().kv_blocks_total == 200
    eng.close()
