"""The CPU routes through the engine: which weight form each route and placement gets and what the ledger books
for it (on every route this machine executes: the ``cpu_route`` fixture), the fp32 route's reordered resident
layers computing the bits of dense streamed and direct ones, and the int8 route with bf16 activations computing
the same bits streamed (slots poisoned before every copy) as direct."""
import pytest
import torch

from gh200rt.backends.cpu import prepack
from gh200rt.backends.cpu.native import load_native_ops, native_ops_error
from gh200rt.backends.cpu.prepack import OneDNNWeight, linear_formats
from gh200rt.backends.cpu.routes import route_for
from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.formats.pack import PackedWeight
from gh200rt.memory.ledger import CPU_DEFAULT_KV_BYTES
from gh200rt.models.layers.dense import onednn_available
from gh200rt.sampling_params import SamplingParams
from tests.cpu_routes import TEST_ROUTES
from tests.engine.real_models import save_tiny_llama

PROMPTS = [[5, 9, 13, 17], [40, 41], list(range(60, 90))]
PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=3)
needs_onednn_bf16 = pytest.mark.skipif(route_for("bfloat16").linear_format is None,
                                       reason="oneDNN cannot run bf16 on this CPU")


def engine(model: str, **options) -> LLMEngine:
    config = EngineConfig.from_kwargs(model=model, max_model_len=128, **options)
    return LLMEngine.from_config(config, poison=True)


def run(eng: LLMEngine, prompts=PROMPTS):
    outs = LLM.from_engine(eng).generate(prompts, PARAMS)
    return [(o.outputs[0].token_ids, [sorted(lp.items()) for lp in o.outputs[0].logprobs]) for o in outs]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_llama(str(tmp_path_factory.mktemp("tiny") / "tiny"), num_layers=4)


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """Every linear large enough for oneDNN (qkv 1024x512 ... lm_head 512x512), so fp32 resident ones are reordered."""
    return save_tiny_llama(str(tmp_path_factory.mktemp("wide") / "wide"), vocab_size=512, num_layers=4,
                           hidden_size=512, intermediate_size=1024)


def test_float32_small_linears_stay_dense(tiny):
    eng = engine(tiny, dtype="float32")
    assert linear_formats(eng.runner.model) == {"dense float32": 17}   # below oneDNN's size: F.linear everywhere
    eng.close()


FP32_PLACEMENTS = {
    "streamed": dict(offload="stream", staging_slots=2, prefetch_distance=1),
    "direct": dict(offload="direct"),
    "mixed": dict(offload="none", layer_tiers="1:streamed,2:direct", staging_slots=1, prefetch_distance=0),
}


@pytest.mark.skipif(not onednn_available(), reason="this torch has no oneDNN inner product")
@pytest.mark.parametrize("kernels,resident_form", [("torch", "OneDNNWeight"), ("native", "NativeRowsWeight")])
def test_float32_reordered_resident_equals_dense_streamed_and_direct(wide, kernels, resident_form):
    """DESIGN invariant 4 across weight forms: resident layers multiply reordered weights (with the native
    kernels: their dense bytes up to NATIVE_F32_MAX_ROWS rows, the reordered copy above), streamed and direct
    ones the dense bytes of their slots and slabs; decode at batch 3 and batch 1 (the one-row rule, or the
    native kernel) and prefill chunks give the same tokens and logprobs bit for bit."""
    if kernels == "native" and load_native_ops() is None:
        pytest.skip(f"native CPU ops unavailable: {native_ops_error()}")
    resident = engine(wide, dtype="float32", offload="none", cpu_kernels=kernels)
    assert linear_formats(resident.runner.model) == {resident_form: 17}
    single = [PROMPTS[0]]
    want = run(resident), run(resident, single)
    resident.close()
    for label, placement in FP32_PLACEMENTS.items():
        eng = engine(wide, dtype="float32", cpu_kernels=kernels, **placement)
        formats = linear_formats(eng.runner.model)
        assert formats["dense float32"] >= 4 and formats.get(resident_form, 0) >= 1, (label, formats)  # lm_head
        assert (run(eng), run(eng, single)) == want, label
        eng.close()


def reordered_copies(model) -> int:
    """Bytes of the reordered copies the model's linears hold now (resident fp32 forms)."""
    refs = [r for i in range(len(model.layers)) for r in model.layer_weight_refs(i).values()]
    total = 0
    for ref in refs + [model.lm_head.weight_ref]:
        form = ref.current
        if isinstance(form, prepack.NativeRowsWeight):
            form = form.batch
        total += form.packed.nbytes if isinstance(form, OneDNNWeight) else 0
    return total


def full_kv_pool(eng: LLMEngine) -> int:
    """The KV cache the CPU default capacity gives: every sequence at full length, at most 2 GiB."""
    config = eng.config
    useful = config.scheduler.max_num_seqs * config.model.max_model_len * eng.plan.sizes.kv_bytes_per_token
    return min(CPU_DEFAULT_KV_BYTES, useful)


def test_default_capacity_books_each_routes_forms_beside_the_full_kv_pool(wide, cpu_route):
    """Each route's resident form (the fp32 routes keep a reordered copy beside the dense bytes, the others
    replace them), booked exactly as the model holds it, and the CPU default capacity makes room for it: the KV
    pool is the route's full one (its KV dtype: bf16 on the bf16 route, float32 elsewhere)."""
    if cpu_route.name.startswith("fp32") and not onednn_available():
        pytest.skip("this torch has no oneDNN inner product: the fp32 route keeps dense weights")
    eng = engine(wide, offload="none", **cpu_route.options)
    model = eng.runner.model
    assert model.dtype == cpu_route.dtype and eng.runner.kv_caches[0].dtype == cpu_route.dtype
    assert linear_formats(model) == {cpu_route.resident_form: 17}
    # the bf16 route's reordered weights replace the dense ones: only the fp32 routes' sit beside them
    beside = reordered_copies(model) if cpu_route.name.startswith("fp32") else 0
    assert eng.ledger.by_kind["cpu_route_forms"] == beside and (beside > 0) == cpu_route.name.startswith("fp32")
    assert eng.ledger.used <= eng.ledger.capacity
    arch = eng.arch
    assert eng.plan.sizes.kv_bytes_per_token == \
        2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * cpu_route.dtype.itemsize
    assert eng.ledger.by_kind["kv_pool"] == full_kv_pool(eng)
    eng.close()


@pytest.mark.skipif(not onednn_available(), reason="this torch has no oneDNN inner product")
@pytest.mark.parametrize("kernels", ["torch", "native"])
def test_float32_reordered_copies_are_planned_under_a_budget(wide, kernels):
    """Under a budget the planner counts the fp32 route's reordered copies, streaming the layers whose copies
    would not fit."""
    if kernels == "native" and load_native_ops() is None:
        pytest.skip(f"native CPU ops unavailable: {native_ops_error()}")
    resident = engine(wide, dtype="float32", offload="none", cpu_kernels=kernels)
    copies = reordered_copies(resident.runner.model)
    assert copies > 0 and resident.ledger.by_kind["cpu_route_forms"] == copies
    # a budget with room for every layer's dense weights but not for all their copies
    kv_room = 64 * resident.store.arena.block_bytes
    budget = resident.ledger.used - resident.ledger.by_kind["kv_pool"] - copies // 2 + kv_room
    resident.close()
    tight = engine(wide, dtype="float32", cpu_kernels=kernels, device_memory_budget=budget)
    tiers = tight.stats().layers_per_tier
    assert tiers.get("streamed", 0) + tiers.get("direct", 0) >= 1, tiers
    assert tight.ledger.by_kind["cpu_route_forms"] == reordered_copies(tight.runner.model) < copies
    assert tight.ledger.used <= budget
    assert run(tight, [PROMPTS[0]])   # and it serves
    tight.close()


@pytest.mark.skipif(not onednn_available(), reason="this torch has no oneDNN inner product")
def test_float32_native_rows_agree_with_torch_kernels_closely(wide):
    """The native float32 kernel sums in another order than oneDNN: the same greedy tokens, logprobs within
    float32 rounding."""
    if load_native_ops() is None:
        pytest.skip(f"native CPU ops unavailable: {native_ops_error()}")
    outs = {}
    for kernels in ("torch", "native"):
        eng = engine(wide, dtype="float32", offload="none", cpu_kernels=kernels)
        outs[kernels] = run(eng)
        eng.close()
    for (tokens, logprobs), (want_tokens, want_logprobs) in zip(outs["native"], outs["torch"]):
        assert tokens == want_tokens
        for got, want in zip(logprobs, want_logprobs):
            assert [t for t, _ in got] == [t for t, _ in want]
            assert max(abs(a.logprob - b.logprob) for (_, a), (_, b) in zip(got, want)) < 1e-4


@pytest.mark.skipif(not onednn_available(), reason="this torch has no oneDNN inner product")
def test_float32_probe_mismatch_keeps_dense_resident_weights(wide, monkeypatch):
    exact = OneDNNWeight.linear
    monkeypatch.setattr(prepack, "_probed", {})
    monkeypatch.setattr(OneDNNWeight, "linear", lambda self, x, bias=None:
                        torch.nextafter(exact(self, x, bias), torch.tensor(float("inf"))))
    eng = engine(wide, dtype="float32", offload="none")
    assert linear_formats(eng.runner.model) == {"dense float32": 17}
    eng.close()


@needs_onednn_bf16
def test_bf16_resident_layers_are_reordered_streamed_ones_are_not(tiny):
    eng = engine(tiny, dtype="bfloat16", offload="none", layer_tiers="1-2:streamed", staging_slots=1,
                 prefetch_distance=0)
    model = eng.runner.model
    resident = TEST_ROUTES["bf16"].resident_form
    assert all(type(r.current).__name__ == resident for i in (0, 3) for r in model.layer_weight_refs(i).values())
    assert all(isinstance(r.current, torch.Tensor) for i in (1, 2) for r in model.layer_weight_refs(i).values())
    assert type(model.lm_head.weight_ref.current).__name__ == resident
    tokens = [t for t, _ in run(eng)]
    assert all(len(t) == 6 for t in tokens)
    eng.close()


@needs_onednn_bf16
def test_int8_with_bf16_activations_streamed_equals_direct(tiny):
    direct = engine(tiny, dtype="bfloat16", offload="direct", host_weight_dtype="int8")
    streamed = engine(tiny, dtype="bfloat16", offload="stream", staging_slots=2, prefetch_distance=1,
                      host_weight_dtype="int8")
    refs = list(direct.runner.model.layer_weight_refs(0).values())
    assert all(isinstance(r.current, PackedWeight) and r.current.fmt == "int8" for r in refs)
    assert type(direct.runner.model.lm_head.weight_ref.current).__name__ == TEST_ROUTES["bf16"].resident_form
    want = run(direct)
    assert run(streamed) == want
    for eng in (direct, streamed):
        eng.close()
