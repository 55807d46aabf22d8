"""fused_moe (Triton, interpreted here) against grouped_experts over the float32 references, every host format."""
import pytest
import torch

from gh200rt.formats.pack import HalfWeight, quantize_fp8, quantize_int4, quantize_int8
from gh200rt.kernels.triton.fused_moe import fused_moe, reference_fused_moe
from gh200rt.kernels.triton.fused_moe_operands import expert_stack, moe_align
from gh200rt.models.layers.moe_experts import route

pytestmark = pytest.mark.interpreter

H, I = 72, 40     # K = 72 / 40 leave part of a 64-column K tile; N = 80 / 72 part of a 64-row N tile

# Tolerances relative to the output's largest magnitude. The interpreter computes every tile in float32 (the
# GPU's TF32 is looser: tests/gpu/test_gpu_fused_moe.py); both sides dequantize the same codes, so the formats
# differ only by the order of float32 additions (dense, int8/fp8 with the scale applied to the accumulator
# rather than to each weight: ~1e-6) and, for group formats, by rounding each dequantized weight once (~1e-6).
TOLERANCE = 2e-5


def make_weight(fmt, n, k, gen):
    w = torch.randn(n, k, generator=gen) / k ** 0.5
    return {"float32": lambda: w, "bfloat16": lambda: w.bfloat16(), "float16": lambda: HalfWeight(w.half()),
            "int8": lambda: quantize_int8(w), "int8-g32": lambda: quantize_int8(w, group_size=32),
            "int4": lambda: quantize_int4(w, group_size=32), "int4-g64": lambda: quantize_int4(w, group_size=64),
            "fp8": lambda: quantize_fp8(w)}[fmt]()


def make_case(fmt, tokens, num_experts, top_k, seed, empty_expert=None, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    gate_up = [make_weight(fmt, 2 * I, H, gen) for _ in range(num_experts)]
    down = [make_weight(fmt, H, I, gen) for _ in range(num_experts)]
    x = torch.randn(tokens, H, generator=gen).to(dtype)
    logits = torch.randn(tokens, num_experts, generator=gen)
    if empty_expert is not None:
        logits[:, empty_expert] = -1e9     # nobody routes here
    weights, ids = route(logits, top_k, renormalize=True)
    return x, weights, ids, gate_up, down


def run_both(x, weights, ids, gate_up, down, scale_fp32=False, block_m=None):
    stacks = [expert_stack(ws, x.device) for ws in (gate_up, down)]
    assert not any(isinstance(s, str) for s in stacks), stacks
    got = fused_moe(x, weights, ids, *stacks, scale_fp32=scale_fp32, block_m=block_m)
    want = reference_fused_moe(x, weights, ids, gate_up, down, scale_fp32)
    return got, want


def worst(got, want):
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "float16", "int8", "int8-g32", "int4", "int4-g64", "fp8"])
def test_every_format_matches_reference(fmt):
    x, weights, ids, gate_up, down = make_case(fmt, tokens=3, num_experts=4, top_k=2, seed=1, empty_expert=2)
    got, want = run_both(x, weights, ids, gate_up, down)
    err = worst(got, want)
    print(f"{fmt} T=3 E=4 k=2: worst relative error {err:.2e}")
    assert got.shape == want.shape and got.dtype == x.dtype and err < TOLERANCE


@pytest.mark.parametrize("tokens,num_experts,top_k", [(1, 4, 2), (17, 8, 3), (64, 6, 2)])
def test_token_counts_and_routing(tokens, num_experts, top_k):
    x, weights, ids, gate_up, down = make_case("int8", tokens, num_experts, top_k, seed=tokens, empty_expert=1)
    for scale_fp32 in (False, True):
        got, want = run_both(x, weights, ids, gate_up, down, scale_fp32)
        err = worst(got, want)
        print(f"int8 T={tokens} E={num_experts} k={top_k} scale_fp32={scale_fp32}: worst relative error {err:.2e}")
        assert err < TOLERANCE


def test_bf16_activations():
    """bf16 rounds gate_up, silu, the product, the expert output and the scaled output (as the torch path does);
    the interpreter truncates those conversions where the GPU rounds to nearest, so a few bf16 ulps of the
    largest output (2^-8 each) separate the two here: 3e-2."""
    x, weights, ids, gate_up, down = make_case("bfloat16", 5, 4, 2, seed=3, dtype=torch.bfloat16)
    got, want = run_both(x, weights, ids, gate_up, down)
    err = worst(got, want)
    print(f"bf16 x bf16: worst relative error {err:.2e} (the interpreter truncates each bf16 rounding)")
    assert got.dtype == torch.bfloat16 and err < 0.03


def test_a_row_does_not_depend_on_the_batch():
    """The same token gives the same bits alone and among 16 others (fixed tile shape)."""
    x, weights, ids, gate_up, down = make_case("int4", 17, 4, 2, seed=5)
    stacks = [expert_stack(ws, x.device) for ws in (gate_up, down)]
    batch = fused_moe(x, weights, ids, *stacks, block_m=16)
    alone = fused_moe(x[5:6], weights[5:6], ids[5:6], *stacks, block_m=16)
    assert torch.equal(batch[5:6], alone)


def test_mixed_addresses_in_one_layer():
    """Experts of one layer in separate allocations (as resident copies and slab views are) read through the table."""
    x, weights, ids, gate_up, down = make_case("int4", 6, 4, 2, seed=9)
    moved = [w.with_tensors({n: t.clone() for n, t in w.tensors().items()}) if e % 2 else w
             for e, w in enumerate(gate_up)]
    got, want = run_both(x, weights, ids, moved, down)
    assert worst(got, want) < TOLERANCE


def test_align_pads_each_expert_to_a_block():
    ids = torch.tensor([[2, 0], [2, 3], [0, 2]])
    sorted_pairs, block_expert = moe_align(ids, num_experts=4, block_m=4)
    pad = ids.numel()
    runs = sorted_pairs.view(-1, 4)
    assert block_expert.tolist()[:3] == [0, 2, 3] and all(e == 4 for e in block_expert.tolist()[3:])
    assert runs[0].tolist() == [1, 4, pad, pad]      # expert 0: pairs (0,1) and (2,0), token order
    assert runs[1].tolist() == [0, 2, 5, pad]
    assert runs[2].tolist() == [3, pad, pad, pad]
    assert (runs[3:] == pad).all()


def test_unreadable_layouts_are_named():
    gen = torch.Generator().manual_seed(0)
    mixed = [make_weight("int8", 8, 72, gen), make_weight("int8-g32", 8, 72, gen)]
    assert "unlike expert 0" in expert_stack(mixed, torch.device("cpu"))
    odd_groups = [quantize_int4(torch.randn(8, 96), group_size=48)]
    assert "group size 48" in expert_stack(odd_groups, torch.device("cpu"))


def _tiny_block(scale_fp32: bool = False):
    from gh200rt.models.arch_config import ArchConfig
    from gh200rt.models.moe import SparseMoeBlock
    arch = ArchConfig("mixtral" if scale_fp32 else "qwen3_moe", hidden_size=H, intermediate_size=64, num_layers=1,
                      num_heads=4, num_kv_heads=2, head_dim=16, vocab_size=100, num_experts=6, num_experts_per_tok=2,
                      moe_intermediate_size=I, norm_topk_prob=True)
    block = SparseMoeBlock(arch, torch.float32, "cpu")
    gen = torch.Generator().manual_seed(11)
    for p in block.parameters():
        p.data.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    for refs in [block.gate.weight_ref] + [r for e in block.expert_refs() for r in e.values()]:
        refs.current.copy_(torch.randn(refs.shape, generator=gen) * 0.2)
    return block


def test_installed_block_matches_the_grouped_path_and_falls_back_for_streamed_experts():
    from gh200rt.backends.cuda.ops import TRITON_OPS
    from gh200rt.backends.interface import switch_hooks
    from gh200rt.models.layers.moe_experts import ExpertAccess
    block = _tiny_block()
    x = torch.randn(7, H, generator=torch.Generator().manual_seed(2))
    want = block(x)
    switch_hooks(block, TRITON_OPS)
    calls = []
    fused, block.fused_experts_fn = block.fused_experts_fn, None
    grouped = block(x)      # the grouped path with the other Triton hooks (SiLU-and-mul)
    block.fused_experts_fn = lambda *a: calls.append(1) or fused(*a)
    got = block(x)
    assert calls and worst(got, want) < TOLERANCE

    class Streamed(ExpertAccess):
        def stages_experts(self) -> bool:
            return True
    block.expert_access = Streamed()
    assert torch.equal(block(x), grouped)       # the grouped path, bit for bit


def test_a_repointed_expert_rebuilds_the_tables():
    from gh200rt.backends.cuda.ops import TRITON_OPS
    from gh200rt.backends.interface import switch_hooks
    block = _tiny_block()
    switch_hooks(block, TRITON_OPS)
    x = torch.randn(5, H, generator=torch.Generator().manual_seed(4))
    before = block(x)
    for ref in block.expert_refs()[0].values():   # an expert moved: same values, new storage
        ref.current = ref.current.clone()
    after_move = block(x)
    for ref in block.expert_refs()[0].values():   # new values: the table must follow the ref
        ref.current = ref.current * 2
    changed = block(x)
    assert torch.equal(before, after_move) and not torch.equal(before, changed)
