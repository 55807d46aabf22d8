"""The layers' kernel hooks: torch by default, switchable to the Triton kernels (interpreted here)
with the same results, and back to torch bit for bit."""
import pytest
import torch

from gh200rt.backends.cuda import ops as cuda_ops
from gh200rt.backends.cuda.ops import install_triton_kernels, use_triton_kernels
from gh200rt.backends.interface import use_torch_kernels
from gh200rt.kv import attention as torch_attention
from gh200rt.kv.pool import allocate_kv_caches
from gh200rt.models.arch_config import ArchConfig
from gh200rt.models.base import AttentionMetadata
from gh200rt.models.layers.activation import SiluAndMul, silu_and_mul
from gh200rt.models.layers.attention import SelfAttention
from gh200rt.models.layers.rmsnorm import RMSNorm, rms_norm
from gh200rt.models.layers.rotary import apply_rotary
from gh200rt.models.llama import LlamaForCausalLM

pytestmark = pytest.mark.interpreter

BLOCK = 16


def tiny_model(qk_norm: bool) -> LlamaForCausalLM:
    arch = ArchConfig("qwen3" if qk_norm else "llama", hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, vocab_size=97, qk_norm=qk_norm)
    torch.manual_seed(0)
    model = LlamaForCausalLM(arch)
    for tensor in model.weight_destinations().values():
        tensor.copy_(torch.randn_like(tensor) * 0.2)
    return model


def run_steps(model, prompt_len: int) -> torch.Tensor:
    """Prefill ``prompt_len`` tokens, then two decode steps; logits of every new token."""
    kv = allocate_kv_caches(2, 5, BLOCK, 2, 8, torch.float32)
    table = [3, 1, 4]  # out of order, so the block table matters
    ids = [(7 * i + 3) % 97 for i in range(prompt_len + 2)]
    outs = []
    for query, seq in ((prompt_len, prompt_len), (1, prompt_len + 1), (1, prompt_len + 2)):
        meta = AttentionMetadata.build([query], [seq], [table], BLOCK)
        hidden = model(torch.tensor(ids[seq - query:seq]), meta.positions(), meta, kv)
        outs.append(model.compute_logits(hidden))
    return torch.cat(outs)


def test_hooks_default_to_the_torch_ops():
    model = tiny_model(qk_norm=True)
    attn = [m for m in model.modules() if isinstance(m, SelfAttention)]
    norms = [m for m in model.modules() if isinstance(m, RMSNorm)]
    assert attn and all(m.rotary_fn is apply_rotary and m.write_kv_fn is torch_attention.write_kv
                        and m.attention_fn is torch_attention.paged_attention for m in attn)
    assert len(norms) == 2 * 2 + 1 + 2 * 2 and all(m.norm_fn is rms_norm for m in norms)
    assert SiluAndMul().act_fn is silu_and_mul


def test_a_cpu_model_keeps_its_torch_ops():
    model = tiny_model(qk_norm=False)
    before = run_steps(model, 5)
    assert use_triton_kernels(model) is False
    assert all(m.norm_fn is rms_norm for m in model.modules() if isinstance(m, RMSNorm))
    assert torch.equal(run_steps(model, 5), before)


@pytest.mark.parametrize("qk_norm", [False, True], ids=["llama", "qwen3-qk-norm"])
@pytest.mark.parametrize("prompt_len", [5, 20], ids=["short-prefill", "long-prefill"])
def test_triton_kernels_match_the_torch_path(monkeypatch, qk_norm, prompt_len):
    from gh200rt.kernels.triton import paged_attention as attention_kernel
    from gh200rt.kernels.triton import rope_store_kv
    model = tiny_model(qk_norm)
    want = run_steps(model, prompt_len)
    kernel_calls, fused_calls = [], []
    for module, name, calls in ((attention_kernel, "paged_attention", kernel_calls),
                                (rope_store_kv, "rope_and_store_kv", fused_calls)):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda q, *a, real=real, calls=calls, **kw:
                            calls.append(q.shape[0]) or real(q, *a, **kw))
    # per layer: attention, SiLU-and-mul, 2 norms (+ q/k norms); plus the final norm
    assert install_triton_kernels(model) == 2 * (1 + 1 + 2 + (2 if qk_norm else 0)) + 1
    got = run_steps(model, prompt_len)
    err = (got - want).abs().max().item()
    print(f"Triton (interpreted) vs torch, qk_norm={qk_norm} prompt={prompt_len}: worst logit error {err:.2e}")
    assert err < 1e-4
    triton_steps = ([prompt_len] if prompt_len <= cuda_ops.TRITON_ATTENTION_MAX_QUERY else []) + [1, 1]
    assert kernel_calls == [t for t in triton_steps for _ in range(2)], "the long prefill keeps the torch attention"
    # every step the Triton attention takes rotates and stores in one launch (Qwen3's q/k norms in it too)
    assert fused_calls == kernel_calls
    rotary = {id(m.rotary_fn): m.rotary_fn for m in model.modules() if isinstance(m, SelfAttention)}
    assert len(rotary) == 1                       # one adapter for the model's layers
    tables = next(iter(rotary.values())).tables_built
    assert tables == (prompt_len > cuda_ops.TRITON_ATTENTION_MAX_QUERY), \
        "the cos|sin table is built once per step that rotates apart from the store (the long prefill), not per layer"
    use_torch_kernels(model)
    assert all(m.add_norm_fn is None for m in model.modules() if isinstance(m, RMSNorm))
    assert torch.equal(run_steps(model, prompt_len), want), "switching back restores the torch path exactly"


def test_long_prefill_keeps_torch_attention(monkeypatch):
    calls = []
    real = torch_attention.paged_attention
    monkeypatch.setattr(torch_attention, "paged_attention", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    q = torch.randn(cuda_ops.TRITON_ATTENTION_MAX_QUERY + 1, 4, 8)
    kv = torch.randn(2, 4, BLOCK, 2, 8)
    meta = AttentionMetadata.build([q.shape[0]], [q.shape[0]], [[1, 2]], BLOCK)
    out = cuda_ops.triton_paged_attention(q, kv, meta, 8 ** -0.5, 2)
    assert calls == [q.shape[0]] and out.shape == q.shape


@pytest.mark.parametrize("shape", [(3, 40), (2, 3, 40)])
def test_triton_activation_module_matches_torch(shape):
    x = torch.randn(*shape)
    act = SiluAndMul()
    want = act(x)
    act.act_fn = cuda_ops.triton_silu_and_mul
    got = act(x)
    assert got.shape == want.shape and (got - want).abs().max().item() < 1e-5
