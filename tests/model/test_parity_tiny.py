"""gh200rt vs transformers on tiny random checkpoints of every family, through the paged path."""
from __future__ import annotations

import pytest
import torch

from gh200rt.config import ModelConfig
from gh200rt.loader import load_model
from tests.model.paged_runner import PagedRunner
from tests.model.tiny_checkpoints import FAMILIES, VOCAB, checkpoint_fixture, save_tiny

PROMPT_LEN, GREEDY_STEPS, TIE_GAP = 64, 32, 1e-4


def prompt(seed: int = 1) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (PROMPT_LEN,), generator=g).tolist()


def relative_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours.float() - ref.float()).abs().max() / ref.float().abs().max())


@torch.no_grad()
def reference_greedy(hf, ids: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    seq, out, step_logits = list(ids), [], []
    for _ in range(steps):
        logits = hf(torch.tensor([seq])).logits[0, -1].float()
        step_logits.append(logits)
        token = int(logits.argmax())
        out.append(token)
        seq.append(token)
    return out, step_logits


def assert_greedy_matches_or_near_tie(ours: list[int], ref: list[int], ref_logits: list[torch.Tensor], label: str):
    if ours == ref:
        return
    j = next(i for i, (a, b) in enumerate(zip(ours, ref)) if a != b)
    top2 = ref_logits[j].topk(2).values
    gap = float(top2[0] - top2[1])
    assert gap < TIE_GAP, f"{label}: greedy differs at step {j} ({ours[j]} vs {ref[j]}) with reference gap {gap:.3g}"


def assert_matches_transformers(hf, model, label: str) -> None:
    """``model``'s prefill logits over ``prompt()`` within 1e-4 (relative) of transformers', then its greedy decode
    steps (``assert_greedy_decode_matches``)."""
    ids = prompt()
    with torch.no_grad():
        ref_logits = hf(torch.tensor([ids])).logits[0].float()
    ours = PagedRunner(model, block_size=4, num_blocks=40).prefill(ids)
    err = relative_error(ours, ref_logits)
    print(f"{label}: prefill logits worst relative error {err:.3g}")
    assert err <= 1e-4, f"{label}: prefill logits relative error {err:.3g} > 1e-4"
    assert_greedy_decode_matches(hf, model, ids, label)


family_checkpoint = checkpoint_fixture(FAMILIES)


def test_fp32_logits_and_greedy_match_transformers(family_checkpoint):
    family, path, hf = family_checkpoint
    loaded = load_model(ModelConfig(model=path, dtype="float32"))
    assert_matches_transformers(hf, loaded.model, family)


def assert_greedy_decode_matches(hf, model, ids: list[int], label: str) -> None:
    """GREEDY_STEPS greedy decode steps through the paged runner: each step's logits within 1e-4 (relative) of
    transformers', and the same tokens (or a first difference at a near tie)."""
    ref_tokens, ref_step_logits = reference_greedy(hf, ids, GREEDY_STEPS)
    our_tokens, our_step_logits = PagedRunner(model, block_size=4, num_blocks=40).greedy(ids, GREEDY_STEPS)
    decode_err = relative_error(our_step_logits, torch.stack(ref_step_logits))
    print(f"{label}: decode logits worst relative error {decode_err:.3g}")
    assert decode_err <= 1e-4, f"{label}: decode-step logits relative error {decode_err:.3g}"
    assert_greedy_matches_or_near_tie(our_tokens, ref_tokens, ref_step_logits, label)


def assert_chunked_prefill_matches_one_shot(path: str, label: str) -> None:
    model = load_model(ModelConfig(model=path, dtype="float32")).model
    ids = prompt(2)
    one_shot = PagedRunner(model, block_size=4, num_blocks=40).prefill(ids)
    chunked = PagedRunner(model, block_size=4, num_blocks=40).prefill(ids, chunks=[23, 41])
    err = relative_error(chunked, one_shot)
    assert err <= 1e-5, f"{label}: chunked prefill differs from one-shot by {err:.3g}"


def test_chunked_prefill_matches_one_shot(family_checkpoint):
    family, path, _ = family_checkpoint
    assert_chunked_prefill_matches_one_shot(path, family)


@pytest.mark.parametrize("dtype,tolerance", [("bfloat16", 4e-2), ("float16", 5e-3)])
def test_half_precision_close_to_fp32_reference(tmp_path, dtype, tolerance):
    hf = save_tiny("llama3-gqa-untied", str(tmp_path))
    loaded = load_model(ModelConfig(model=str(tmp_path), dtype=dtype))
    assert loaded.model.embed_tokens.dtype == getattr(torch, dtype)
    ids = prompt(3)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float()
    ours = PagedRunner(loaded.model, block_size=8, num_blocks=20).prefill(ids)
    assert ours.dtype == torch.float32
    err = relative_error(ours, ref)
    assert err <= tolerance, f"{dtype}: relative error {err:.3g} > {tolerance}"
