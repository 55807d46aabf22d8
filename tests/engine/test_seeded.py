"""Acceptance 3: a seeded request samples the same tokens alone and inside a mixed batch."""
from gh200rt.sampling_params import SamplingParams
from tests.engine.real_models import SharedModel, smollm2_gguf


def test_seeded_sampling_is_batch_invariant_on_smollm2():
    shared = SharedModel(smollm2_gguf(), "gh200rt")
    seeded = [SamplingParams(temperature=0.8, top_p=0.95, top_k=50, seed=s, max_tokens=8, ignore_eos=True)
              for s in (1, 2)]
    prompts = ["The capital of France is", "Once upon a time"]
    llm = shared.llm(max_model_len=256)
    alone = [llm.generate([p], sp)[0].token_ids for p, sp in zip(prompts, seeded)]
    others = ["Write a haiku about rain.", "List three prime numbers:", "def fibonacci(n):", "Hello"]
    mixed_prompts = [others[0], prompts[0], others[1], others[2], prompts[1], others[3]]
    noise = SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True)
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    mixed_params = [noise, seeded[0], greedy, noise, seeded[1], greedy]
    mixed = shared.llm(max_model_len=256, max_num_batched_tokens=16).generate(mixed_prompts, mixed_params)
    assert [mixed[1].token_ids, mixed[4].token_ids] == alone
    assert alone[0] != llm.generate([prompts[0]], SamplingParams(temperature=0.8, top_p=0.95, top_k=50, seed=3,
                                                                 max_tokens=8, ignore_eos=True))[0].token_ids
