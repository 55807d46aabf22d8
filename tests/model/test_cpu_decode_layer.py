"""The one-call decode layer (backends/cpu/decode_layer.py, kernels/cpu/decode_layer.c) against the same layer run
op by op on the same native ops: the same output bits and the same KV pool, for every weight form it takes,
and None (the op-by-op path) wherever any op would go elsewhere."""
from __future__ import annotations

import pytest
import torch

from gh200rt.backends.cpu.half_linear import NATIVE_F16_MAX_ROWS
from gh200rt.backends.cpu.linear import NATIVE_F32_MAX_ROWS
from gh200rt.backends.cpu.native import native_ops_error
from gh200rt.backends.cpu.ops import use_native_cpu_kernels, use_torch_cpu_kernels
from gh200rt.backends.cpu.routes import route_unavailable
from gh200rt.formats.pack import pack_weight
from gh200rt.models.base import AttentionMetadata
from gh200rt.models.layers.dense import onednn_available
from tests.model.native_layers import BLOCK, OPS, decode_step, model_with

pytestmark = pytest.mark.skipif(OPS is None, reason=f"native CPU ops unavailable: {native_ops_error()}")


def run_layer(model, layer_index: int, meta, hidden, pool, fused: bool):
    layer = model.layers[layer_index]
    saved = layer.decode_layer_fn
    calls = []
    if fused:
        def spy(*args):
            out = saved(*args)
            calls.append(out is not None)
            return out
        layer.decode_layer_fn = spy
    else:
        layer.decode_layer_fn = None
    try:
        with torch.inference_mode():
            cos_sin = model.rotary.tables(meta.positions(), hidden.dtype)
            out = layer(hidden, *cos_sin, meta, pool)
    finally:
        layer.decode_layer_fn = saved
    return out, calls


def compare(model, rows: int, expect_fused: bool, seed: int = 0, pool_dtype: torch.dtype | None = None):
    gen = torch.Generator().manual_seed(seed)
    blocks = max(200, sum(-(-(5 + 7 * r % 240) // BLOCK) for r in range(rows)))
    meta = decode_step(rows, gen, blocks)
    pool = torch.randn(2, blocks, BLOCK, 2, 16, generator=gen, dtype=torch.float32).to(pool_dtype or model.dtype)
    hidden = torch.randn(rows, 64, generator=gen).to(model.dtype)
    for layer in range(len(model.layers)):
        pool_a, pool_b = pool.clone(), pool.clone()
        got, calls = run_layer(model, layer, meta, hidden, pool_a, fused=True)
        want, _ = run_layer(model, layer, meta, hidden, pool_b, fused=False)
        assert calls == [expect_fused]
        assert torch.equal(got, want), (layer, (got - want).abs().max())
        pool_a, pool_b, before = (p.view(torch.uint8) if p.element_size() == 1 else p for p in (pool_a, pool_b, pool))
        assert torch.equal(pool_a, pool_b)
        assert not torch.equal(pool_a, before)  # the step's K/V were written


FORMS = ["dense", "int8", "int4", "fp16", "one-row-blocks"] + (["native-rows"] if onednn_available() else [])


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("rows", [1, 3, NATIVE_F32_MAX_ROWS])
def test_fused_layer_has_the_op_by_op_bits(form, rows):
    model = model_with(form)
    compare(model, rows, expect_fused=True)
    # a second step reuses the cached arguments with new step tensors
    compare(model, rows, expect_fused=True, seed=1)


@pytest.mark.parametrize("fp8_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("form", ["dense", "fp16"])
def test_fused_layer_writes_and_reads_an_fp8_pool_with_the_layers_scales(fp8_dtype, form):
    model = model_with(form)
    for layer in model.layers:
        layer.self_attn.kv_scale.copy_(torch.tensor([0.05, 0.02]))
    compare(model, 3, expect_fused=True, pool_dtype=fp8_dtype)
    model.layers[0].self_attn.kv_scale.mul_(3)   # rescaled in place (a calibration): the next call reads it
    compare(model, 3, expect_fused=True, seed=1, pool_dtype=fp8_dtype)


@pytest.mark.parametrize("form", ["dense", "int4"])
def test_fused_layer_adds_the_qkv_bias_as_the_linear_does(form):
    model = model_with(form, name="qwen2")
    assert model.layers[0].self_attn.qkv_proj.bias is not None
    compare(model, 2, expect_fused=True)


def test_rows_beyond_the_native_linears_go_op_by_op():
    compare(model_with("dense"), NATIVE_F32_MAX_ROWS + 1, expect_fused=False)
    compare(model_with("fp16"), NATIVE_F16_MAX_ROWS + 1, expect_fused=False)   # fbgemm's fp16 GEMM
    compare(model_with("int8"), 12, expect_fused=True)  # the quantized linear takes up to 16 rows


def test_prefill_and_mixed_steps_go_op_by_op():
    model = model_with("dense")
    gen = torch.Generator().manual_seed(0)
    pool = torch.randn(2, 200, BLOCK, 2, 16, generator=gen)
    for query_lens, lens in (([3], [3]), ([1, 2], [6, 9])):
        meta = AttentionMetadata.build(query_lens, lens, [[10, 11, 12], [20, 21, 22]][:len(lens)], BLOCK)
        hidden = torch.randn(sum(query_lens), 64, generator=gen)
        _, calls = run_layer(model, 0, meta, hidden, pool.clone(), fused=True)
        assert calls == [False]


def test_kv_scale_calibration_and_other_pools_go_op_by_op():
    model = model_with("dense")
    gen = torch.Generator().manual_seed(0)
    meta = decode_step(2, gen)
    hidden = torch.randn(2, 64, generator=gen)
    _, calls = run_layer(model, 0, meta, hidden, torch.zeros(2, 200, BLOCK, 2, 16, dtype=torch.bfloat16), fused=True)
    assert calls == [False]
    model.layers[0].self_attn.calculate_kv_scales = True
    _, calls = run_layer(model, 0, meta, hidden, torch.zeros(2, 200, BLOCK, 2, 16), fused=True)
    assert calls == [False]


def test_a_new_weight_object_rebuilds_the_arguments():
    """A streamed layer's weights are new objects as the layer moves through the staging ring: the cached
    arguments must follow them (here a dense weight swapped for a packed one and back)."""
    model = model_with("dense")
    compare(model, 2, expect_fused=True)
    ref = model.layer_weight_refs(1)["mlp.down_proj"]
    dense = ref.current
    ref.current = pack_weight(dense, "int8")
    compare(model, 2, expect_fused=True)
    ref.current = dense.clone()
    compare(model, 2, expect_fused=True)


def test_torch_kernels_drop_the_fused_path():
    model = model_with("dense")
    use_torch_cpu_kernels(model)
    assert all(layer.decode_layer_fn is None for layer in model.layers)
    use_native_cpu_kernels(model)
    compare(model, 1, expect_fused=True)


@pytest.mark.skipif(route_unavailable("bf16") is not None, reason=f"the bf16 route's oneDNN weights: "
                                                                   f"{route_unavailable('bf16')}")
def test_bf16_activations_take_one_call_through_the_gguf_row_form():
    """The bf16 route: one sequence decoding a GGUF checkpoint's blocks has the op-by-op bits in one call (rows
    widened for the blocks, outputs and residual sums rounded to bf16, a bf16 pool); more sequences, and dense
    bf16 weights, go op by op (oneDNN's linears)."""
    model = model_with("bf16-one-row-blocks", dtype=torch.bfloat16)
    compare(model, 1, expect_fused=True)
    compare(model, 1, expect_fused=True, seed=1)
    biased = model_with("bf16-one-row-blocks", name="qwen2", dtype=torch.bfloat16)   # widened as the form adds it
    assert biased.layers[0].self_attn.qkv_proj.bias.dtype == torch.bfloat16
    compare(biased, 1, expect_fused=True)
    compare(model, 2, expect_fused=False)
    compare(model_with("dense", dtype=torch.bfloat16), 1, expect_fused=False)
    gen = torch.Generator().manual_seed(0)
    _, calls = run_layer(model, 0, decode_step(1, gen), torch.randn(1, 64, dtype=torch.bfloat16),
                         torch.zeros(2, 200, BLOCK, 2, 16), fused=True)       # a float32 pool: op by op
    assert calls == [False]


TILED_FORMS = [pytest.param(form, marks=pytest.mark.skipif(
    OPS is None or not (OPS.amx_available() if "amx" in form else OPS.bf16_dot_available()),
    reason="this CPU runs no " + ("AMX" if "amx" in form else "AVX-512 BF16") + " tiles"))
    for form in ("bf16-amx", "bf16-dot", "bf16-amx-one-row-blocks", "bf16-dot-one-row-blocks")]


@pytest.mark.parametrize("form", TILED_FORMS)
@pytest.mark.parametrize("rows", [2, 5, 40])
def test_bf16_tiles_take_one_call_at_any_row_count(form, rows):
    """The bf16 route's tiled weights (AMX, AVX-512 BF16 dot products; a GGUF checkpoint's batch form): every row
    count in one call with the op-by-op bits, the gate/up product's SiLU fused as the MLP fuses it; a bias (Qwen2's
    qkv) added in float32 as the tiles add it."""
    compare(model_with(form, dtype=torch.bfloat16), rows, expect_fused=True)
    compare(model_with(form, name="qwen2", dtype=torch.bfloat16), rows, expect_fused=True, seed=1)


def test_a_layer_after_an_op_by_op_one_takes_its_residual_add():
    """Layer 0 op by op leaves its last residual add to layer 1 (``forward_deferred``); layer 1's one-call path adds
    it first, so the model's hidden states keep the all-op-by-op bits."""
    model = model_with("dense")
    gen = torch.Generator().manual_seed(5)
    meta = decode_step(2, gen)
    pool = torch.randn(2, 2, 200, BLOCK, 2, 16, generator=gen)
    ids = torch.tensor([3, 9])
    hooks = [layer.decode_layer_fn for layer in model.layers]
    received = []

    def spy(layer, hidden, residual, *rest):
        received.append(residual is not None)
        return hooks[1](layer, hidden, residual, *rest)

    def run(first, second):
        model.layers[0].decode_layer_fn, model.layers[1].decode_layer_fn = first, second
        kv = pool.clone()
        with torch.inference_mode():
            return model(ids, meta.positions(), meta, list(kv)), kv

    want, want_kv = run(None, None)
    got, got_kv = run(None, spy)
    model.layers[0].decode_layer_fn, model.layers[1].decode_layer_fn = hooks
    assert received == [True]
    assert torch.equal(got, want) and torch.equal(got_kv, want_kv)
