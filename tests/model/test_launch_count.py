"""Kernels a decode step launches on the GPU ops (Triton interpreted here), counted per decoder layer, and the
counter itself."""
import pytest
import torch

from gh200rt.backends.cuda.ops import install_triton_kernels
from gh200rt.kv.pool import allocate_kv_caches
from gh200rt.launch_count import counting_launches
from gh200rt.models.arch_config import ArchConfig
from gh200rt.models.base import AttentionMetadata
from gh200rt.models.llama import LlamaForCausalLM

BLOCK = 16


def decode_step_launches(num_layers: int, qk_norm: bool = False):
    arch = ArchConfig("qwen3" if qk_norm else "llama", hidden_size=32, intermediate_size=64, num_layers=num_layers,
                      num_heads=4, num_kv_heads=2, head_dim=8, vocab_size=97, qk_norm=qk_norm)
    model = LlamaForCausalLM(arch)
    for tensor in model.weight_destinations().values():
        tensor.copy_(torch.randn_like(tensor) * 0.2)
    install_triton_kernels(model)
    kv = allocate_kv_caches(num_layers, 5, BLOCK, 2, 8, torch.float32)
    meta = AttentionMetadata.build([1, 1], [6, 3], [[3, 1], [4]], BLOCK)
    with counting_launches() as count:
        model.compute_logits(model(torch.tensor([1, 2]), meta.positions(), meta, kv))
    return count


@pytest.mark.interpreter
@pytest.mark.parametrize("qk_norm", [False, True], ids=["llama", "qwen3-qk-norm"])
def test_a_decoder_layer_launches_nine_kernels_on_the_gpu_ops(qk_norm):
    """Four GEMMs, the input norm with the previous layer's residual add fused into it, RoPE with the KV store
    (Qwen3's q/k norms in it), attention, the attention's residual add fused into the second norm and SiLU-and-mul:
    9 (before: 10 with the MLP's residual add a launch of its own, 12 before that, Qwen3 17 with two copies making
    the normed q/k heads contiguous)."""
    two, three = decode_step_launches(2, qk_norm), decode_step_launches(3, qk_norm)
    per_layer = three.total - two.total
    print(f"2 layers: {two.summary(20)}\n3 layers: {three.summary(20)}")
    assert per_layer == 9, f"a layer launches {per_layer} kernels"
    layer = (three.triton + three.torch_ops) - (two.triton + two.torch_ops)
    assert layer == {"mm": 4, "rmsnorm_kernel": 2, "rope_store_kv_kernel": 1, "paged_attention_kernel": 1,
                     "silu_mul_kernel": 1}


def test_counts_work_not_views_or_allocations():
    x = torch.randn(4, 6)
    with counting_launches() as count:
        y = x.reshape(-1).view(6, 4)[1:].t()     # views only
        torch.empty(3)
        z = (y + 1).sum()
        x.t().reshape(-1)                        # not contiguous: reshape copies
    assert dict(count.torch_ops) == {"add": 1, "sum": 1, "clone": 1} and count.total == 3
    assert z.item() == pytest.approx(float((x.view(6, 4)[1:] + 1).sum()))
