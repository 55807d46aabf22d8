"""LoRA on a GPU: the compiled SGMV kernels against the per-token reference, and the engine (Triton path, eager
steps) against transformers with the adapters merged, for two adapters and the base model in one batch."""
import pytest

from tests.kernels.test_lora_sgmv import DTYPES, RUNS, case, tol, worst

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(RUNS))
def test_compiled_kernels_match_reference(compiled_triton, dtype, name):
    from gh200rt.kernels.triton.lora_sgmv import lora_add_triton, reference_lora_add
    from gh200rt.lora.step import lora_step
    x, y, a, b, scales, token_slots = (t.cuda() for t in case(RUNS[name], dtype, k=4096, n=1000, r=48))
    want = reference_lora_add(x.cpu(), y.cpu(), a.cpu(), b.cpu(), scales.cpu(), token_slots.cpu())
    step = lora_step(RUNS[name], "cuda", for_triton=True)
    got = y.clone()
    if step.segs is not None:
        lora_add_triton(x, got, a, b, scales, step.segs, step.max_len)
    err = worst(got.cpu(), want)
    print(f"lora sgmv {dtype} {name}: worst relative error {err:.2e}")
    assert err <= tol(dtype) * 4


def test_engine_mixed_batch_matches_merged_transformers(compiled_triton, tmp_path_factory):
    from tests.lora.peft_files import merged_model, write_peft_adapter
    from tests.lora.test_lora_parity import GREEDY, PROMPTS, hf_greedy, make_llm, tokens_and_logprobs
    from tests.model.tiny_checkpoints import save_tiny
    root = tmp_path_factory.mktemp("gpu-lora")
    hf = save_tiny("llama3-gqa-untied", str(root / "model"))
    tiny = {"path": str(root / "model"), "root": root,
            "sql": write_peft_adapter(str(root / "sql"), hf, r=4, alpha=8, targets=("q_proj", "v_proj"), seed=1),
            "chat": write_peft_adapter(str(root / "chat"), hf, r=8, alpha=16, seed=2, use_rslora=True)}
    llm = make_llm(tiny)
    assert llm.engine.lora.batch.use_triton
    names = list(PROMPTS)
    outs = llm.generate([PROMPTS[n] for n in names], GREEDY, lora_request=[None if n == "base" else n for n in names])
    refs = {"base": hf, "sql": merged_model(hf, tiny["sql"]), "chat": merged_model(hf, tiny["chat"])}
    for name, out in zip(names, outs):
        ours, our_lp = tokens_and_logprobs(out)
        want, want_lp = hf_greedy(refs[name], PROMPTS[name])
        gap = max(abs(p - q) for p, q in zip(our_lp, want_lp))
        print(f"{name}: tokens {ours} vs {want}, worst logprob gap {gap:.2e}")
        assert ours == want and gap < 1e-3
