"""The decode stack in one call (backends/cpu/decode_stack.py, ``gh_decode_layers``) against the same model's
layers run one call each: the same hidden states and the same KV pools, its cached arguments following every
change the layers' own would follow, and the layers one by one wherever any of them would not take its one call
or the weight hooks have work between layers."""
from __future__ import annotations

import pytest
import torch

from gh200rt.backends.cpu.native import native_ops_error
from gh200rt.backends.cpu.ops import use_native_cpu_kernels, use_torch_cpu_kernels
from gh200rt.backends.cpu.routes import route_unavailable
from gh200rt.engine.model_runner import forward
from gh200rt.formats.pack import pack_weight
from gh200rt.models.base import AttentionMetadata
from gh200rt.weights.schedule import NULL_HOOKS, LayerHooks, StreamingSchedule
from tests.model.native_layers import BLOCK, OPS, decode_step, model_with

pytestmark = pytest.mark.skipif(OPS is None, reason=f"native CPU ops unavailable: {native_ops_error()}")
LAYERS = 3   # the stack's buffers between layers are taken in turn: three layers use both


class Counting:
    """Wraps a model's ``decode_stack_fn``: how many of its calls ran the stack (returned an output)."""

    def __init__(self, model):
        self.inner, self.ran, self.declined = model.decode_stack_fn, 0, 0
        model.decode_stack_fn = self

    def __call__(self, *args):
        out = self.inner(*args)
        if out is None:
            self.declined += 1
        else:
            self.ran += 1
        return out


def run(model, meta, ids, pools, stacked: bool, hooks=NULL_HOOKS):
    saved = model.decode_stack_fn
    if not stacked:
        model.decode_stack_fn = None
    try:
        kv = [p.clone() for p in pools]
        with torch.inference_mode():
            out = forward(model, ids, meta.positions(), meta, kv, hooks)
        return out, kv
    finally:
        model.decode_stack_fn = saved


def pools_for(model, gen, dtype=None):
    return [torch.randn(2, 200, BLOCK, 2, 16, generator=gen).to(dtype or model.dtype) for _ in model.layers]


def assert_same(model, rows: int, seed: int, expect_stacked: bool, dtype=None, hooks=NULL_HOOKS):
    gen = torch.Generator().manual_seed(seed)
    meta = decode_step(rows, gen)
    ids = torch.randint(0, 64, (rows,), generator=gen)
    pools = pools_for(model, gen, dtype)
    counter = Counting(model)
    try:
        got, got_kv = run(model, meta, ids, pools, stacked=True, hooks=hooks)
        want, want_kv = run(model, meta, ids, pools, stacked=False, hooks=hooks)
    finally:
        model.decode_stack_fn = counter.inner
    assert counter.ran == int(expect_stacked)
    assert torch.equal(got, want), (got - want).abs().max()
    for a, b, before in zip(got_kv, want_kv, pools):
        a, b, before = (p.view(torch.uint8) if p.element_size() == 1 else p for p in (a, b, before))
        assert torch.equal(a, b)
        assert not torch.equal(a, before)   # every layer wrote its K/V


@pytest.mark.parametrize("form", ["dense", "int8", "int4", "fp16", "one-row-blocks"])
@pytest.mark.parametrize("rows", [1, 3])
def test_the_stack_has_the_layer_by_layer_bits(form, rows):
    model = model_with(form, layers=LAYERS)
    assert_same(model, rows, seed=0, expect_stacked=True)
    assert_same(model, rows, seed=1, expect_stacked=True)    # the cached arguments, new step tensors and pools


def test_qkv_bias_and_an_fp8_pool():
    model = model_with("int4", name="qwen2", layers=LAYERS)
    assert_same(model, 2, seed=0, expect_stacked=True)
    model = model_with("dense", layers=LAYERS)
    for layer in model.layers:
        layer.self_attn.kv_scale.copy_(torch.tensor([0.05, 0.02]))
    assert_same(model, 2, seed=0, expect_stacked=True, dtype=torch.float8_e4m3fn)


def test_a_weight_moved_or_repacked_rebuilds_the_stack():
    model = model_with("dense", layers=LAYERS)
    assert_same(model, 2, seed=0, expect_stacked=True)
    ref = model.layer_weight_refs(2)["mlp.down_proj"]
    dense = ref.current
    ref.current = pack_weight(dense, "int8")
    assert_same(model, 2, seed=1, expect_stacked=True)
    ref.current = dense.clone()        # the same shape and form at another address
    assert_same(model, 2, seed=2, expect_stacked=True)


def test_a_layer_that_goes_op_by_op_runs_the_stack_one_by_one():
    model = model_with("dense", layers=LAYERS)
    assert_same(model, 2, seed=0, expect_stacked=True)
    model.layers[1].self_attn.calculate_kv_scales = True          # a KV-scale calibration step
    assert_same(model, 2, seed=1, expect_stacked=False)
    model.layers[1].self_attn.calculate_kv_scales = False
    assert_same(model, 2, seed=2, expect_stacked=True)
    model.layers[0].decode_layer_fn = lambda *args: None           # not the native one-call layer
    assert_same(model, 2, seed=3, expect_stacked=False)
    ineligible = model_with("dense", layers=LAYERS)
    ineligible.layers[2].partial_rotary = True
    assert_same(ineligible, 2, seed=0, expect_stacked=False)
    bf16_pool = model_with("dense", layers=LAYERS)                  # a pool the native attention does not read
    assert_same(bf16_pool, 2, seed=0, expect_stacked=False, dtype=torch.bfloat16)


def test_prefill_and_mixed_steps_run_layer_by_layer():
    model = model_with("dense", layers=LAYERS)
    counter = Counting(model)
    gen = torch.Generator().manual_seed(0)
    for query_lens, lens in (([3], [3]), ([1, 2], [6, 9])):
        meta = AttentionMetadata.build(query_lens, lens, [[10, 11, 12], [20, 21, 22]][:len(lens)], BLOCK)
        run(model, meta, torch.randint(0, 64, (sum(query_lens),), generator=gen), pools_for(model, gen),
            stacked=True)
    assert (counter.ran, counter.declined) == (0, 2)


def test_hooks_with_work_between_layers_keep_the_layers_apart():
    class Recording(LayerHooks):
        def __init__(self):
            self.calls = []

        def before_layer(self, index):
            self.calls.append(index)

    assert not LayerHooks().between_layers() and Recording().between_layers()
    schedule = StreamingSchedule.__new__(StreamingSchedule)
    schedule.position = {}                        # no layer through the staging ring
    assert not schedule.between_layers()
    schedule.position = {1: 0}
    assert schedule.between_layers()
    model = model_with("dense", layers=LAYERS)
    hooks = Recording()
    assert_same(model, 1, seed=0, expect_stacked=False, hooks=hooks)
    assert hooks.calls == [0, 1, 2] * 2


def test_switching_kernels_drops_the_stack():
    model = model_with("dense", layers=LAYERS)
    assert_same(model, 1, seed=0, expect_stacked=True)
    use_torch_cpu_kernels(model)
    assert model.decode_stack_fn is None
    use_native_cpu_kernels(model)
    assert_same(model, 1, seed=1, expect_stacked=True)


@pytest.mark.skipif(route_unavailable("bf16") is not None, reason=f"the bf16 route's oneDNN weights: "
                                                                   f"{route_unavailable('bf16')}")
def test_bf16_activations_through_the_gguf_row_form():
    model = model_with("bf16-one-row-blocks", dtype=torch.bfloat16, layers=LAYERS)
    assert_same(model, 1, seed=0, expect_stacked=True)
    assert_same(model, 2, seed=1, expect_stacked=False)        # oneDNN's linears for two rows
