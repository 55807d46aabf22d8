"""The batched LoRA kernels (Triton, interpreted here) and the torch grouped path against the per-token
reference: mixed slots and base tokens (-1), segments of one row, shapes that are not multiples of the blocks."""
import pytest
import torch

from gh200rt.kernels.triton.lora_sgmv import lora_add_triton, reference_lora_add
from gh200rt.lora.grouped import lora_add_grouped
from gh200rt.lora.step import NO_SLOT, lora_step

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# (slot, tokens) per sequence, in batch order
RUNS = {
    "mixed": [(0, 5), (NO_SLOT, 3), (1, 1), (1, 2), (NO_SLOT, 1), (0, 17), (2, 1)],
    "one row": [(1, 1)],
    "base only": [(NO_SLOT, 4)],
    "long segment": [(2, 40), (0, 1)],
}


def tol(dtype):
    return {torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 3e-3}[dtype]


def case(runs, dtype, k=100, n=70, r=24, slots=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    t = sum(c for _, c in runs)
    x = torch.randn(t, k, generator=gen).to(dtype)
    y = torch.randn(t, n, generator=gen).to(dtype)
    a = (0.3 * torch.randn(slots, r, k, generator=gen)).to(dtype)
    b = (0.3 * torch.randn(slots, n, r, generator=gen)).to(dtype)
    scales = torch.tensor([0.5, 2.0, 1.25])[:slots]
    token_slots = torch.tensor([s for s, c in runs for _ in range(c)])
    return x, y, a, b, scales, token_slots


def worst(got, want):
    return (got.float() - want.float()).abs().max().item() / max(1.0, want.float().abs().max().item())


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(RUNS))
def test_triton_matches_reference(dtype, name):
    x, y, a, b, scales, token_slots = case(RUNS[name], dtype)
    want = reference_lora_add(x, y, a, b, scales, token_slots)
    step = lora_step(RUNS[name], "cpu", for_triton=True)
    got = y.clone()
    if step.segs is not None:
        lora_add_triton(x, got, a, b, scales, step.segs, step.max_len)
    err = worst(got, want)
    print(f"lora triton {dtype} {name}: worst relative error {err:.2e}")
    assert err <= tol(dtype)
    base_rows = token_slots == NO_SLOT
    assert torch.equal(got[base_rows], y[base_rows]), "a base-model token must be left exactly as it was"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(RUNS))
def test_grouped_torch_matches_reference(dtype, name):
    x, y, a, b, scales, token_slots = case(RUNS[name], dtype)
    want = reference_lora_add(x, y, a, b, scales, token_slots)
    step = lora_step(RUNS[name], "cpu", for_triton=False)
    got = lora_add_grouped(x, y.clone(), a, b, scales.tolist(), step.groups)
    err = worst(got, want)
    print(f"lora grouped {dtype} {name}: worst relative error {err:.2e}")
    assert err <= tol(dtype)


def test_segments_merge_runs_of_one_slot_and_skip_the_base():
    step = lora_step([(0, 2), (0, 3), (NO_SLOT, 1), (1, 1), (0, 1)], "cpu", for_triton=False)
    assert step.segments == [(0, 0, 5), (1, 6, 7), (0, 7, 8)]
    assert step.max_len == 5
    groups = dict((slot, rows) for slot, rows in step.groups)
    assert groups[1] == slice(6, 7)
    assert groups[0].tolist() == [0, 1, 2, 3, 4, 7]


COMPILE = """
import os
os.environ.pop("TRITON_INTERPRET", None)
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from gh200rt.kernels.triton.compile_specs import all_specs
for spec in all_specs():
    if spec.name.startswith("lora_"):
        out = triton.compile(ASTSource(spec.fn, spec.signature, spec.constexprs), target=GPUTarget("cuda", 90, 32),
                             options=dict(num_warps=spec.num_warps))
        print(spec.name, spec.label, "mma" in out.asm["ptx"])
"""


def test_kernels_compile_for_hopper():
    """Both kernels, every dtype, compiled to PTX for sm_90 (no GPU needed): bf16 / fp16 dots on the tensor cores
    (tf32), a float32 model's in full float32 (no mma)."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line.split() for line in out.stdout.splitlines() if line.strip()]
    print("\n".join(" ".join(line) for line in lines))
    assert len(lines) == 6 and all((line[-1] == "True") == (line[1] != "fp32") for line in lines), out.stdout
