"""LoRA parity: gh200rt's engine (float32, CPU) against transformers with the adapter merged into its weights,
for two adapters and the base model in one batch; each request in the mixed batch equals the request run alone."""
from __future__ import annotations

import pytest
import torch

from gh200rt import LLM, SamplingParams
from gh200rt.lora.request import LoRARequest
from tests.lora.peft_files import ATTENTION, merged_model, write_peft_adapter
from tests.model.tiny_checkpoints import save_tiny

STEPS = 8
PROMPTS = {"base": [5, 9, 17, 33, 4, 71, 8, 100, 12, 6, 44], "sql": [7, 7, 19, 203, 40, 8, 3],
           "chat": [90, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    hf = save_tiny("llama3-gqa-untied", str(root / "model"))
    sql = write_peft_adapter(str(root / "sql"), hf, r=4, alpha=8, targets=("q_proj", "v_proj", "down_proj"), seed=1)
    chat = write_peft_adapter(str(root / "chat"), hf, r=8, alpha=16, seed=2, use_rslora=True)
    return {"path": str(root / "model"), "hf": hf, "sql": sql, "chat": chat, "root": root}


def make_llm(tiny, **options) -> LLM:
    kwargs = dict(model=tiny["path"], dtype="float32", max_model_len=128, num_kv_blocks=96, block_size=4,
                  enable_lora=True, lora_modules=(f"sql={tiny['sql']}", f"chat={tiny['chat']}"), max_loras=2,
                  max_lora_rank=8)
    return LLM(**{**kwargs, **options})


@torch.no_grad()
def hf_greedy(hf, ids: list[int]) -> tuple[list[int], list[float]]:
    seq, tokens, logprobs = list(ids), [], []
    for _ in range(STEPS):
        logp = torch.log_softmax(hf(torch.tensor([seq])).logits[0, -1].double(), -1)
        token = int(logp.argmax())
        tokens.append(token)
        logprobs.append(float(logp[token]))
        seq.append(token)
    return tokens, logprobs


def tokens_and_logprobs(output) -> tuple[list[int], list[float]]:
    choice = output.outputs[0]
    return choice.token_ids, [lp[t].logprob for t, lp in zip(choice.token_ids, choice.logprobs)]


GREEDY = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True, logprobs=0)


def test_two_adapters_and_the_base_in_one_batch_match_merged_transformers(tiny):
    llm = make_llm(tiny)
    registry = llm.engine.lora
    adapters_per_step = []
    begin = registry.begin_step

    def spy(scheduled):
        adapters_per_step.append(({item.seq.lora_id for item in scheduled}, len(scheduled)))
        begin(scheduled)
    registry.begin_step = spy
    names = list(PROMPTS)
    outs = llm.generate([PROMPTS[n] for n in names], GREEDY,
                        lora_request=[None if n == "base" else LoRARequest(n, 1) for n in names])
    assert adapters_per_step[0][1] == 3 and len(adapters_per_step[0][0]) == 3, \
        f"base + two adapters were meant to share the first step, got {adapters_per_step[0]}"
    refs = {"base": tiny["hf"], "sql": merged_model(tiny["hf"], tiny["sql"]),
            "chat": merged_model(tiny["hf"], tiny["chat"])}
    for name, out in zip(names, outs):
        ours, our_lp = tokens_and_logprobs(out)
        want, want_lp = hf_greedy(refs[name], PROMPTS[name])
        worst = max(abs(a - b) for a, b in zip(our_lp, want_lp))
        print(f"{name}: tokens {ours} (transformers {want}); worst logprob gap {worst:.2e}")
        assert ours == want, f"{name}: greedy tokens differ from transformers with the adapter merged"
        assert worst < 1e-4
    base_alone = hf_greedy(tiny["hf"], PROMPTS["sql"])[0]
    assert tokens_and_logprobs(outs[1])[0] != base_alone, "the adapter should change this prompt's tokens"
    # each request of the mixed batch equals the same request run alone
    for name, out in zip(names, outs):
        alone = llm.generate([PROMPTS[name]], GREEDY, lora_request=None if name == "base" else name)[0]
        a, b = tokens_and_logprobs(alone), tokens_and_logprobs(out)
        assert a[0] == b[0] and max(abs(x - y) for x, y in zip(a[1], b[1])) < 1e-5, name


def test_max_loras_bounds_the_adapters_of_a_step_and_others_wait(tiny):
    llm = make_llm(tiny, max_loras=1)
    registry = llm.engine.lora
    seen = []
    begin = registry.begin_step

    def spy(scheduled):
        seen.append({item.seq.lora_id for item in scheduled} - {0})
        begin(scheduled)
    registry.begin_step = spy
    outs = llm.generate([PROMPTS["sql"], PROMPTS["chat"], PROMPTS["base"]], GREEDY,
                        lora_request=["sql", "chat", None])
    assert all(len(s) <= 1 for s in seen), seen
    assert {frozenset(s) for s in seen if s} == {frozenset({1}), frozenset({2})}, "both adapters ran, one at a time"
    assert seen[0] == {1} and registry.slot_loads == 2, "one slot, reloaded for the second adapter"
    assert all(len(o.outputs[0].token_ids) == STEPS for o in outs)
    ref = make_llm(tiny).generate([PROMPTS["chat"]], GREEDY, lora_request="chat")[0]
    assert tokens_and_logprobs(outs[1])[0] == tokens_and_logprobs(ref)[0]


def test_prefix_cache_is_not_shared_between_adapters(tiny):
    llm = make_llm(tiny)
    prompt = list(range(10, 40))
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    first = llm.generate([prompt], params, lora_request="sql")[0]
    other = llm.generate([prompt], params, lora_request="chat")[0]
    base = llm.generate([prompt], params)[0]
    again = llm.generate([prompt], params, lora_request="sql")[0]
    assert first.num_cached_tokens == 0
    assert other.num_cached_tokens == 0 and base.num_cached_tokens == 0, "KV computed under sql reused elsewhere"
    assert again.num_cached_tokens >= 24, "the same adapter reuses its own prefix blocks"
    assert again.outputs[0].token_ids == first.outputs[0].token_ids


def test_ledger_books_the_slots_and_host_cache_is_lru(tiny):
    from gh200rt.lora.slots import slot_bytes
    llm = make_llm(tiny, max_cpu_loras=2, max_loras=1)
    engine = llm.engine
    booked = engine.ledger.by_kind["lora_slots"]
    assert booked == slot_bytes(engine.arch, 1, 8, torch.float32) > 0
    assert booked == sum(lin.a.nbytes + lin.b.nbytes for lin in engine.lora.slots.linears.values())
    third = write_peft_adapter(str(tiny["root"] / "third"), tiny["hf"], r=2, alpha=2, targets=ATTENTION, seed=3)
    out = llm.generate([PROMPTS["base"]], GREEDY, lora_request=LoRARequest("third", 7, third))[0]
    assert len(engine.lora.host_ids) == 2 and engine.lora.by_name["sql"].id not in engine.lora.host_ids
    # sql was dropped from host memory: it is read again from its path when a request needs it
    again = llm.generate([PROMPTS["sql"]], GREEDY, lora_request="sql")[0]
    want = hf_greedy(merged_model(tiny["hf"], tiny["sql"]), PROMPTS["sql"])[0]
    assert again.outputs[0].token_ids == want and len(out.outputs[0].token_ids) == STEPS


def test_unloading_lets_running_requests_finish_and_refuses_new_ones(tiny):
    llm = make_llm(tiny)
    engine = llm.engine
    want = llm.generate([PROMPTS["sql"]], GREEDY, lora_request="sql")[0].outputs[0].token_ids
    engine.add_request("r1", None, GREEDY, prompt_token_ids=PROMPTS["sql"], lora_request="sql")
    engine.step()
    engine.remove_lora("sql")
    tokens = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens = out.outputs[0].token_ids
    assert tokens == want
    with pytest.raises(ValueError, match="no LoRA adapter named 'sql'"):
        engine.add_request("r2", None, GREEDY, prompt_token_ids=PROMPTS["sql"], lora_request="sql")
    engine.add_lora("sql", tiny["sql"])          # loaded again: a new id, its own prefix blocks
    assert engine.lora.by_name["sql"].id == 3
