"""Resident linears converted for the CPU route: OneDNNWeight multiplies as F.linear does in bf16 and gives
dense_linear's bits in float32, the start-up probe decides the fp32 form, and the weight store converts
exactly the resident weights (and a layer promoted back to resident)."""
import logging

import pytest
import torch
import torch.nn.functional as F

from gh200rt.backends.cpu import prepack
from gh200rt.backends.cpu.linear import NATIVE_F32_MAX_ROWS, native_dense_linear
from gh200rt.backends.cpu.native import load_native_ops, native_ops_error
from gh200rt.backends.cpu.ops import use_native_cpu_kernels
from gh200rt.backends.cpu.prepack import OneDNNWeight, linear_formats, resident_linear_format
from gh200rt.backends.cpu.routes import route_for
from gh200rt.config import MemoryConfig
from gh200rt.formats.pack import HalfWeight
from gh200rt.models.arch_config import ArchConfig
from gh200rt.models.layers.dense import dense_linear, onednn_available
from gh200rt.models.registry import build_model
from gh200rt.planner.cost_model import model_sizes
from gh200rt.planner.planner import make_plan
from gh200rt.platform.detect import detect
from gh200rt.weights.store import WeightStore

needs_onednn_bf16 = pytest.mark.skipif(route_for("bfloat16").linear_format is None,
                                       reason="oneDNN cannot run bf16 on this CPU")


def shapes(gen, k):
    return {"1 row": torch.randn(1, k, generator=gen), "7 rows": torch.randn(7, k, generator=gen),
            "100 rows": torch.randn(100, k, generator=gen), "3-D": torch.randn(2, 3, k, generator=gen),
            "non-contiguous": torch.randn(5, 2 * k, generator=gen)[:, ::2], "empty": torch.randn(0, k, generator=gen)}


@needs_onednn_bf16
@pytest.mark.parametrize("n,k", [(960, 576), (576, 1536), (33, 40)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_onednn_weight_matches_bf16_f_linear(n, k, with_bias):
    gen = torch.Generator().manual_seed(n + k)
    w = (torch.randn(n, k, generator=gen) * 0.05).bfloat16()
    bias = torch.randn(n, generator=gen).bfloat16() if with_bias else None
    packed = OneDNNWeight(w)
    for name, x in shapes(gen, k).items():
        x = x.bfloat16()
        got, want = packed.linear(x, bias), F.linear(x, w, bias)
        exact = F.linear(x.float(), w.float(), None if bias is None else bias.float())
        err = (got.float() - want.float()).abs().max().item() if got.numel() else 0.0
        scale = exact.abs().max().item() if exact.numel() else 0.0
        print(f"{n}x{k} {name} bias={with_bias}: max |oneDNN - F.linear| {err:.3g} (output scale {scale:.3g})")
        assert got.shape == want.shape and got.dtype == torch.bfloat16
        # one bf16 rounding of the output apart at most (both accumulate in fp32)
        assert err <= 2 ** -7 * max(1.0, scale)
    with pytest.raises(TypeError):
        packed.linear(torch.randn(1, k))


needs_onednn = pytest.mark.skipif(not onednn_available(), reason="this torch has no oneDNN inner product")


@needs_onednn
@pytest.mark.parametrize("n,k", [(960, 576), (576, 1536), (512, 512)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fp32_onednn_weight_gives_dense_linear_bits(n, k, with_bias):
    """Every input shape, one row included (the one-row rule), bit for bit: a resident layer computes what
    the same weight streamed or read in place computes."""
    gen = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=gen) * 0.05
    bias = torch.randn(n, generator=gen) if with_bias else None
    packed = OneDNNWeight(w)
    for name, x in shapes(gen, k).items():
        got, want = packed.linear(x, bias), dense_linear(x, w, bias)
        worst = (got - want).abs().max().item() if got.numel() else 0.0
        assert got.shape == want.shape and torch.equal(got, want), f"{n}x{k} {name}: worst {worst:.3g}"
    with pytest.raises(TypeError):
        packed.linear(torch.randn(1, k).bfloat16())


def tiny_arch(hidden: int = 32, intermediate: int = 48, vocab: int = 64) -> ArchConfig:
    return ArchConfig(architecture="llama", vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                      num_layers=3, num_heads=4, num_kv_heads=2, head_dim=hidden // 4, max_position_embeddings=64,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True)


def random_model(arch: ArchConfig, dtype: torch.dtype, seed: int = 0):
    """``arch``'s model with normal random embedding and linear weights (seeded)."""
    torch.manual_seed(seed)
    model = build_model(arch, dtype)
    with torch.no_grad():
        model.embed_tokens.normal_()
        for i in range(arch.num_layers):
            for ref in model.layer_weight_refs(i).values():
                ref.current.normal_()
    return model


def wide_fp32_model():
    """qkv 1024x512, o 512x512, gate_up 2048x512, down 512x1024, tied lm_head 512x512: all go to oneDNN."""
    return random_model(tiny_arch(hidden=512, intermediate=1024, vocab=512), torch.float32)


@needs_onednn
def test_fp32_probe_passes_here_and_resident_weights_are_reordered(monkeypatch):
    monkeypatch.setattr(prepack, "_probed", {})
    model = wide_fp32_model()
    assert resident_linear_format(model, "onednn-fp32", native_kernels=False) == "onednn-fp32"
    assert set(prepack._probed) == {(1024, 512, False), (512, 512, False), (2048, 512, False),
                                        (512, 1024, False)}
    embedding = model.embed_tokens.clone()
    dense = {k: r.current.clone() for k, r in model.layer_weight_refs(1).items()}
    store = place(model, "fp32", "onednn-fp32", offload="none", layer_tiers="1:streamed")
    assert linear_formats(model) == {"OneDNNWeight": 9, "dense float32": 4}  # layer 1 streams from dense bytes
    assert torch.equal(model.embed_tokens, embedding)  # the tied embedding still reads its dense tensor
    store.set_tier(1, "resident")
    assert linear_formats(model) == {"OneDNNWeight": 13}
    x = torch.randn(1, 512)
    got = model.layer_weight_refs(1)["mlp.gate_up_proj"].current.linear(x)
    assert torch.equal(got, dense_linear(x, dense["mlp.gate_up_proj"]))
    store.close()


@needs_onednn
def test_fp32_native_rows_form_keeps_dense_bytes_and_the_streamed_bits(monkeypatch):
    """With the native kernels, resident float32 linears hold their dense bytes (the native kernel's, up to
    NATIVE_F32_MAX_ROWS rows) beside the reordered copy; at every row count a resident layer computes the
    bits a direct layer computes from the same dense bytes (its host slab) through native_dense_linear."""
    ops = load_native_ops()
    if ops is None:
        pytest.skip(f"native CPU ops unavailable: {native_ops_error()}")
    monkeypatch.setattr(prepack, "_probed", {})
    model = wide_fp32_model()
    assert resident_linear_format(model, "onednn-fp32", native_kernels=True) == "onednn-fp32+native"
    assert use_native_cpu_kernels(model) is None
    dense = {k: r.current.clone() for k, r in model.layer_weight_refs(1).items()}
    store = place(model, "fp32", "onednn-fp32+native", offload="none", layer_tiers="1:direct")
    assert linear_formats(model) == {"NativeRowsWeight": 9, "dense float32": 4}
    form = model.layer_weight_refs(0)["mlp.gate_up_proj"].current
    assert form.nbytes == 2 * form.dense.nbytes and form.dense.data_ptr() != 0
    direct = {rows: model.layers[1].mlp.gate_up_proj(torch.randn(rows, 512, generator=torch.Generator()
                                                                   .manual_seed(rows)))
                for rows in (1, 2, NATIVE_F32_MAX_ROWS, NATIVE_F32_MAX_ROWS + 1, 40)}
    store.set_tier(1, "resident")
    assert linear_formats(model) == {"NativeRowsWeight": 13}
    linear = native_dense_linear(ops)
    for rows, want in direct.items():
        x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows))
        assert torch.equal(model.layers[1].mlp.gate_up_proj(x), want), rows
        assert torch.equal(want, linear(x, dense["mlp.gate_up_proj"])), rows
    store.close()


def test_fp32_small_weights_stay_dense():
    """Below oneDNN's size dense_linear takes F.linear, so the resident copy stays dense too."""
    model = build_model(tiny_arch(), torch.float32)
    assert resident_linear_format(model, "onednn-fp32", native_kernels=False) == \
        ("onednn-fp32" if onednn_available() else None)
    place(model, "fp32", "onednn-fp32", offload="none")
    assert linear_formats(model) == {"dense float32": 13}


@needs_onednn
def test_fp32_probe_mismatch_keeps_dense_weights(monkeypatch, caplog):
    exact = OneDNNWeight.linear
    monkeypatch.setattr(prepack, "_probed", {})
    monkeypatch.setattr(OneDNNWeight, "linear", lambda self, x, bias=None:
                        torch.nextafter(exact(self, x, bias), torch.tensor(float("inf"))))
    model = wide_fp32_model()
    with caplog.at_level(logging.WARNING, logger=prepack.__name__):
        assert resident_linear_format(model, "onednn-fp32") is None
    assert "keep dense weights" in caplog.text and "(2048, 512, False)" in caplog.text
    assert resident_linear_format(model, "onednn-bf16", native_kernels=False) == "onednn-bf16"  # not probed


def place(model, dtype: str, linear_format: str | None, **memory) -> WeightStore:
    plan = make_plan(model_sizes(model.arch, dtype), detect("cpu"), MemoryConfig(**memory), 1 << 30)
    store = WeightStore(model, platform=plan.platform, cpu_linear_format=linear_format)
    store.apply(plan)
    return store


@needs_onednn_bf16
def test_only_resident_weights_are_converted_and_values_survive():
    model = random_model(tiny_arch(), torch.bfloat16)
    dense = {i: {k: r.current.clone() for k, r in model.layer_weight_refs(i).items()} for i in range(3)}
    store = place(model, "bf16", "onednn-bf16", offload="none", layer_tiers="1:direct")
    kept = model.layer_weight_refs(1)["mlp.down_proj"].current    # read in place from its host slab
    assert isinstance(kept, torch.Tensor) and torch.equal(kept, dense[1]["mlp.down_proj"])
    assert linear_formats(model) == {"OneDNNWeight": 9, "dense bfloat16": 4}  # 4 linears x 2 layers + lm_head
    assert model.embed_tokens.dtype == torch.bfloat16  # the tied embedding still reads its dense tensor
    x = torch.randn(3, 32).bfloat16()
    ref = model.layer_weight_refs(0)["self_attn.qkv_proj"]
    assert ref.current.shape == tuple(dense[0]["self_attn.qkv_proj"].shape)
    assert torch.allclose(ref.current.linear(x).float(), F.linear(x, dense[0]["self_attn.qkv_proj"]).float(),
                          atol=2e-2, rtol=2e-2)
    store.set_tier(1, "resident")                 # promoted: converted like the layers resident from the start
    assert linear_formats(model) == {"OneDNNWeight": 13}
    store.close()
    untouched = build_model(tiny_arch(), torch.bfloat16)
    place(untouched, "bf16", None, offload="none")
    assert linear_formats(untouched) == {"dense bfloat16": 13}


def test_fp16_route_converts_fp32_weights_to_half_weights():
    model = random_model(tiny_arch(), torch.float32)
    big = model.layer_weight_refs(2)["mlp.down_proj"]
    big.current[0, 0] = 1e6  # beyond fp16's range: stays dense float32
    place(model, "fp32", "fp16", offload="none")
    assert isinstance(model.layer_weight_refs(0)["mlp.gate_up_proj"].current, HalfWeight)
    assert isinstance(big.current, torch.Tensor) and big.current.dtype == torch.float32
    assert linear_formats(model) == {"HalfWeight": 12, "dense float32": 1}


def test_the_bf16_route_takes_the_amx_form_where_amx_runs():
    model = build_model(tiny_arch(), torch.bfloat16)
    want = "amx-bf16" if prepack.amx_available() else "dot-bf16" if prepack.bf16_dot_available() \
        else "onednn-bf16"
    assert resident_linear_format(model, "onednn-bf16") == want
    assert resident_linear_format(model, "onednn-bf16", native_kernels=False) == "onednn-bf16"


class CountingOps:
    """The native ops, counting ``amx_linear`` calls."""

    def __init__(self, ops):
        self.ops, self.calls = ops, 0

    def amx_linear(self, *args, **kwargs):
        self.calls += 1
        return self.ops.amx_linear(*args, **kwargs)


@pytest.mark.skipif(not prepack.amx_available(), reason="this CPU or OS runs no AMX tiles")
def test_amx_form_takes_a_prompt_steps_rows_in_one_call():
    """Resident bf16 linears with K a multiple of 32 take the AMX form (down_proj's K of 48 keeps oneDNN's); a step
    of prompt positions (row blocks asked for) multiplies all its rows in one call, each row with its bits alone."""
    model = random_model(tiny_arch(), torch.bfloat16)
    dense = model.layer_weight_refs(0)["mlp.gate_up_proj"].current.clone()
    store = place(model, "bf16", "amx-bf16", offload="none")
    assert linear_formats(model) == {"AmxWeight": 10, "OneDNNWeight": 3}  # qkv, o, gate_up x 3 + lm_head; down x 3
    linear = model.layers[0].mlp.gate_up_proj
    weight = linear.weight_ref.current
    counting = CountingOps(weight.ops)
    weight.ops = counting
    x = torch.randn(300, 32).bfloat16()
    with torch.inference_mode():
        many = linear(x, 64)
        assert counting.calls == 1
        for row in (0, 64, 299):
            assert torch.equal(linear(x[row:row + 1], 64)[0], many[row])
    torch.testing.assert_close(many.float(), F.linear(x, dense).float(), atol=3e-2, rtol=2e-2)
    store.close()


@pytest.mark.skipif(not prepack.amx_available(), reason="this CPU or OS runs no AMX tiles")
def test_the_gated_mlp_fuses_the_silu_into_the_amx_product_with_the_same_bits():
    """gate_up is packed gated (its halves of 48 rows are multiples of 16); with the native ops the MLP computes
    silu(gate) * up in the product's call, with the bits of the product followed by the native silu_mul; with
    torch's SiLU it does not fuse."""
    model = random_model(tiny_arch(), torch.bfloat16, seed=1)
    store = place(model, "bf16", "amx-bf16", offload="none")
    assert use_native_cpu_kernels(model) is None
    mlp = model.layers[0].mlp
    gate_up = mlp.gate_up_proj.weight_ref.current
    assert gate_up.gated_inter == 48 and model.layers[0].self_attn.qkv_proj.weight_ref.current.gated_inter == 0
    counting = CountingOps(gate_up.ops)
    gate_up.ops = counting
    x = torch.randn(40, 32).bfloat16()
    with torch.inference_mode():
        for block_rows in (None, 64):
            calls = counting.calls
            fused = mlp(x, block_rows)
            assert counting.calls == calls + 1   # the SiLU came out of the product's call
            assert torch.equal(fused, mlp.down_proj(mlp.act(mlp.gate_up_proj(x, block_rows)), block_rows))
        mlp.act.act_fn = lambda gate_up: F.silu(gate_up[..., :48]) * gate_up[..., 48:]   # not the native op
        calls = counting.calls
        mlp(x)
        assert counting.calls == calls + 1       # the product alone, then torch's SiLU
    store.close()
