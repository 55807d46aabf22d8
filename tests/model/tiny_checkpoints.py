"""Tiny random transformers checkpoints saved as HF directories (safetensors + a tokenizers tokenizer)."""
from __future__ import annotations

import json
import os

import torch

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
LINEAR_ROPE = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}

# name -> (config class name, kwargs)
FAMILIES = {
    "llama3-gqa-untied": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                                              rope_parameters=LLAMA3_ROPE)),
    "llama-linear-mha-tied": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=4,
                                                  tie_word_embeddings=True, rope_parameters=LINEAR_ROPE)),
    "mistral-mha-untied": ("MistralConfig", dict(num_attention_heads=4, num_key_value_heads=4,
                                                 tie_word_embeddings=False, sliding_window=None)),
    "qwen2-gqa-tied": ("Qwen2Config", dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen3-gqa-untied": ("Qwen3Config", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                             tie_word_embeddings=False)),
}
VOCAB = 256


def make_hf_model(family: str, seed: int = 0):
    import transformers
    class_name, kwargs = FAMILIES[family]
    config = getattr(transformers, class_name)(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, max_position_embeddings=256,
        bos_token_id=1, eos_token_id=2, rms_norm_eps=1e-6, **kwargs)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.15)
    return model


CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def write_tokenizer(path: str, vocab_size: int = VOCAB, chat_template: str | None = CHAT_TEMPLATE) -> None:
    """A word-level tokenizer over "w3" ... "w{vocab_size-1}" with <unk>/<s>/</s> at ids 0-2."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(os.path.join(path, "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
              "tokenizer_class": "PreTrainedTokenizerFast"}
    if chat_template is not None:
        config["chat_template"] = chat_template
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)


def save_tiny(family: str, path: str, seed: int = 0):
    model = make_hf_model(family, seed)
    model.save_pretrained(path, safe_serialization=True)
    write_tokenizer(path)
    return model
