"""The one-row decode layer in six launches (backends/cuda/decode_layer.py), interpreted here: a decode step gives the
op-by-op Triton path's logits and KV cache, bit for bit in float32 (for Llama and Qwen3's q/k norms; bfloat16 to
the interpreter's rounding); steps it does not apply to (a prefill, a quantized linear) run op by op."""
import pytest
import torch

from gh200rt.backends.cuda.decode_layer import fused_decode_layer, gpu_decode_layer
from gh200rt.backends.cuda.ops import TRITON_OPS, install_triton_kernels
from gh200rt.formats.pack import pack_weight
from gh200rt.kernels.triton import gemv as gemv_module
from gh200rt.kv.pool import allocate_kv_caches
from gh200rt.models.arch_config import ArchConfig
from gh200rt.models.base import AttentionMetadata
from gh200rt.models.layers.dense import dense_linear
from gh200rt.models.layers.linear import RefLinear
from gh200rt.models.llama import LlamaForCausalLM

pytestmark = pytest.mark.interpreter

BLOCK = 16


def one_row_gemv(x, weight, bias=None):
    """``triton_dense_linear`` as on CUDA: one row through the GEMV (on a CPU tensor it would take torch's)."""
    if x.numel() == x.shape[-1]:
        return gemv_module.gemv(x, weight, bias)
    return dense_linear(x, weight, bias)


def tiny_model(qk_norm: bool, dtype: torch.dtype) -> LlamaForCausalLM:
    arch = ArchConfig("qwen3" if qk_norm else "llama", hidden_size=64, intermediate_size=96, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=16, vocab_size=97, qk_norm=qk_norm)
    torch.manual_seed(0)
    model = LlamaForCausalLM(arch, dtype)
    for tensor in model.weight_destinations().values():
        tensor.copy_(torch.randn_like(tensor) * 0.2)
    install_triton_kernels(model)
    for module in model.modules():
        if isinstance(module, RefLinear):
            module.dense_fn = one_row_gemv
    return model


def run_steps(model, dtype, decode_layer) -> tuple[torch.Tensor, torch.Tensor]:
    """A 5-token prefill and three decode steps with every layer's ``decode_layer_fn`` = ``decode_layer``: the
    logits of every new token and the KV pool after."""
    for layer in model.layers:
        layer.decode_layer_fn = decode_layer
    kv = allocate_kv_caches(2, 5, BLOCK, 2, 16, dtype)
    table = [3, 1, 4]
    ids = [(7 * i + 3) % 97 for i in range(8)]
    outs = []
    for query, seq in ((5, 5), (1, 6), (1, 7), (1, 8)):
        meta = AttentionMetadata.build([query], [seq], [table], BLOCK)
        hidden = model(torch.tensor(ids[seq - query:seq]), meta.positions(), meta, kv)
        outs.append(model.compute_logits(hidden))
    return torch.cat(outs), torch.stack(kv)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("qk_norm", [False, True], ids=["llama", "qwen3-qk-norm"])
def test_fused_decode_layers_give_the_op_by_op_bits(monkeypatch, qk_norm, dtype):
    model = tiny_model(qk_norm, dtype)
    want_logits, want_kv = run_steps(model, dtype, None)
    rows = []
    real = gemv_module.gemv
    monkeypatch.setattr(gemv_module, "gemv", lambda x, *a, **k: rows.append(x.shape[0]) or real(x, *a, **k))
    got_logits, got_kv = run_steps(model, dtype, fused_decode_layer)
    assert rows == [1] * (3 * (2 * 4 + 1)), "three decode steps: two layers' four products and the head, one row"
    if dtype == torch.float32:
        assert torch.equal(got_kv, want_kv) and torch.equal(got_logits, want_logits)
        return
    # bfloat16: the interpreter truncates where a GPU rounds to nearest, and the op-by-op layer's last residual
    # add is torch's (rounded to nearest), the fused one the kernel's: held to a few units of the last place here
    # (tests/gpu/test_gpu_decode_layer.py compares them compiled)
    for got, want in ((got_kv, want_kv), (got_logits, want_logits)):
        assert (got.float() - want.float()).abs().max() <= 2 ** -6 * want.float().abs().max()
    assert torch.equal(got_logits.argmax(-1), want_logits.argmax(-1))


def test_prefill_and_quantized_linears_run_op_by_op():
    model = tiny_model(False, torch.float32)
    layer = model.layers[0]
    kv = allocate_kv_caches(2, 5, BLOCK, 2, 16, torch.float32)
    prefill = AttentionMetadata.build([3], [3], [[1]], BLOCK)
    hidden = torch.randn(3, 64)
    cos, sin = model.rotary.tables(prefill.positions(), hidden.dtype)
    assert fused_decode_layer(layer, hidden, None, cos, sin, prefill, kv[0]) is None, "three rows"
    decode = AttentionMetadata.build([1], [4], [[1]], BLOCK)
    cos, sin = model.rotary.tables(decode.positions(), hidden.dtype)
    layer.mlp.down_proj.weight_ref.current = pack_weight(layer.mlp.down_proj.weight_ref.current, "int8")
    assert fused_decode_layer(layer, hidden[:1], None, cos, sin, decode, kv[0]) is None, "an int8 linear"
    assert gpu_decode_layer(layer, hidden[:1], None, cos, sin, decode, kv[0]) is None, "CPU activations"


def test_the_triton_ops_install_it():
    model = tiny_model(False, torch.float32)
    assert TRITON_OPS["decode_layer"] is gpu_decode_layer
    assert all(layer.decode_layer_fn is gpu_decode_layer for layer in model.layers)


def test_a_fused_layer_after_an_op_by_op_one_takes_its_residual_add():
    """Layer 0 op by op leaves its last residual add to layer 1 (``forward_deferred``): the fused layer adds it
    before its first product, so the steps keep the all-op-by-op bits (float32)."""
    model = tiny_model(False, torch.float32)
    want_logits, want_kv = run_steps(model, torch.float32, None)
    received = []

    def second_layer_only(layer, hidden, residual, *rest):
        if layer is model.layers[0]:
            return None
        received.append(residual is not None)
        return fused_decode_layer(layer, hidden, residual, *rest)

    got_logits, got_kv = run_steps(model, torch.float32, second_layer_only)
    assert received == [True] * 4, "the prefill (one call declines it) and three decode steps"
    assert torch.equal(got_kv, want_kv) and torch.equal(got_logits, want_logits)


def run_batch(model, dtype, decode_layer, rows: int = 3):
    """``rows`` sequences' prompts (one step, op by op), then three decode steps of all of them with every layer's
    ``decode_layer_fn`` = ``decode_layer``: the logits of every new token and the KV pool after."""
    for layer in model.layers:
        layer.decode_layer_fn = decode_layer
    kv = allocate_kv_caches(2, 3 * rows + 1, BLOCK, 2, 16, dtype)
    tables = [[1 + 3 * r, 2 + 3 * r, 3 + 3 * r] for r in range(rows)]
    prompts = [[(7 * i + 11 * r + 3) % 97 for i in range(4 + r)] for r in range(rows)]
    meta = AttentionMetadata.build([len(p) for p in prompts], [len(p) for p in prompts], tables, BLOCK)
    outs = [model.compute_logits(model(torch.tensor(sum(prompts, [])), meta.positions(), meta, kv))]
    for step in range(3):
        lens = [len(p) + step + 1 for p in prompts]
        meta = AttentionMetadata.build([1] * rows, lens, tables, BLOCK)
        ids = torch.tensor([(5 * step + r) % 97 for r in range(rows)])
        outs.append(model.compute_logits(model(ids, meta.positions(), meta, kv)))
    return torch.cat(outs), torch.stack(kv)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_a_multi_row_decode_step_runs_fused_with_the_op_by_op_values(monkeypatch, dtype):
    """Three sequences decode through the fused rows products (``max_rows`` 4): the op-by-op path's logits and KV
    cache to rounding (the products sum in another order), the same greedy tokens; the prompt step runs op by op."""
    from gh200rt.kernels.triton import fused_rows as rows_module
    model = tiny_model(False, dtype)
    want_logits, want_kv = run_batch(model, dtype, None)
    calls = []
    real = rows_module.fused_rows
    monkeypatch.setattr(rows_module, "fused_rows", lambda x, *a, **k: calls.append(x.shape[0]) or real(x, *a, **k))
    got_logits, got_kv = run_batch(model, dtype, lambda *args: fused_decode_layer(*args, max_rows=4))
    assert calls == [3] * (3 * 2 * 4), "three decode steps: two layers' four products, three rows each"
    tolerance = 2 ** -5 if dtype == torch.bfloat16 else 2 ** -8
    for got, want in ((got_kv, want_kv), (got_logits, want_logits)):
        assert (got.float() - want.float()).abs().max() <= tolerance * want.float().abs().max()
    assert torch.equal(got_logits.argmax(-1), want_logits.argmax(-1))


def test_multi_row_steps_beyond_max_rows_or_in_float32_run_op_by_op():
    model = tiny_model(False, torch.bfloat16)
    layer = model.layers[0]
    kv = allocate_kv_caches(2, 5, BLOCK, 2, 16, torch.bfloat16)
    decode = AttentionMetadata.build([1, 1, 1], [4, 2, 3], [[1], [2], [3]], BLOCK)
    cos, sin = model.rotary.tables(decode.positions(), torch.bfloat16)
    hidden = torch.randn(3, 64, dtype=torch.bfloat16)
    assert fused_decode_layer(layer, hidden, None, cos, sin, decode, kv[0]) is None, "max_rows 1"
    assert fused_decode_layer(layer, hidden, None, cos, sin, decode, kv[0], max_rows=2) is None, "three rows"
    assert fused_decode_layer(layer, hidden, None, cos, sin, decode, kv[0], max_rows=3) is not None
    fp32 = tiny_model(False, torch.float32)
    assert fused_decode_layer(fp32.layers[0], hidden.float(), None, cos.float(), sin.float(), decode,
                              kv[0].float(), max_rows=3) is None, "float32 rows would multiply in TF32"
    mixed = AttentionMetadata.build([2, 1], [4, 3], [[1], [2]], BLOCK)
    cos, sin = model.rotary.tables(mixed.positions(), torch.bfloat16)
    assert fused_decode_layer(layer, hidden, None, cos, sin, mixed, kv[0], max_rows=3) is None, "a prompt chunk"
