"""A tiny random Llama whose tokenizer is byte-level BPE (every byte a token, a few merges, ChatML
specials), so it can write any text: JSON, regex matches, tool calls. Its chat template passes
``tools`` in as Qwen/Hermes templates do. Random weights + temperature 1 make the unconstrained
output noise, which is what the structured-output tests need: only the grammar makes it valid."""
from __future__ import annotations

import json
import os

import torch

MERGES = [('"', ':'), ('{', '"'), (',', ' '), ('t', 'r'), ('tr', 'u'), ('tru', 'e')]
SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 288          # the model's logits are wider than the tokenizer's vocabulary, as in real checkpoints
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools: <tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] %}{{ m['content'] }}{% endif %}"
    "{% if m['tool_calls'] %}{% for c in m['tool_calls'] %}<tool_call>\n{{ c['function'] | tojson }}\n</tool_call>"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_byte_tokenizer(path: str) -> int:
    """tokenizer.json + tokenizer_config.json; returns the tokenizer's vocabulary size."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    encoded = [(_byte_level(a), _byte_level(b)) for a, b in MERGES]
    for a, b in encoded:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab, encoded, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    tok.save(os.path.join(path, "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "<|im_end|>", "unk_token": "<unk>",
              "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE}
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    return tok.get_vocab_size(with_added_tokens=True)


def _byte_level(text: str) -> str:
    from tokenizers import pre_tokenizers
    return "".join(piece for piece, _ in pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
                   .pre_tokenize_str(text))


def save_byte_llama(path: str) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    n = write_byte_tokenizer(path)
    assert n <= VOCAB_SIZE, n
    config = LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         bos_token_id=1, eos_token_id=4, tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)
    return path


def serve_byte_llama(tmp_path_factory, *args: str):
    """``python -m gh200rt.serve`` over a byte-level Llama written for the module, served as "byte" (and ``args``):
    the ``ServerProcess``, for a fixture to yield and stop."""
    from tests.server.helpers import ServerProcess   # httpx and psutil: only where a server starts
    path = save_byte_llama(str(tmp_path_factory.mktemp("byte-llama")))
    return ServerProcess("gh200rt.serve", ["--model", path, "--served-model-name", "byte", *args])
