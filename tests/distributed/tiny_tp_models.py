"""Tiny random checkpoints for the tensor-parallel tests: a Llama with fewer KV heads than query heads, a Mistral
with as many KV heads as ranks (2), a Qwen3 with fewer KV heads (1) than ranks."""
from __future__ import annotations

import torch

from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from tests.model.tiny_checkpoints import write_tokenizer

VOCAB = 256
TP_FAMILIES = {
    "llama-gqa": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)),
    "mistral-kv-per-rank": ("MistralConfig", dict(num_attention_heads=4, num_key_value_heads=2,
                                                  tie_word_embeddings=True, sliding_window=None)),
    "qwen3-one-kv-head": ("Qwen3Config", dict(num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                                              tie_word_embeddings=False)),
}


def save_tp_tiny(family: str, path: str, vocab_size: int = VOCAB) -> str:
    import transformers
    class_name, kwargs = TP_FAMILIES[family]
    config = getattr(transformers, class_name)(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2, max_position_embeddings=256,
        bos_token_id=1, eos_token_id=2, rms_norm_eps=1e-6, **kwargs)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.uniform_(0.5, 1.5) if "norm" in name else p.normal_(0.0, 0.15)
    model.save_pretrained(path, safe_serialization=True)
    write_tokenizer(path, vocab_size)
    return path


def tp_llm(path: str, tensor_parallel_size: int, **options) -> LLM:
    config = EngineConfig.from_kwargs(**{"model": path, "dtype": "float32", "num_kv_blocks": 48, "max_model_len": 128,
                                         "max_num_seqs": 8, "tensor_parallel_size": tensor_parallel_size, **options})
    return LLM.from_engine(LLMEngine.from_config(config))
