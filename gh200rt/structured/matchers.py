"""Per-engine llguidance state: the tokenizer view (built on first use, ~0.2 s for a 49k vocabulary),
a thread pool that computes the masks of a batch in parallel, and one matcher per sequence."""
from __future__ import annotations

import json

import llguidance

from gh200rt.structured.constraint import Constraint


class SequenceGrammar:
    """One sequence's grammar state; it advances with every token the engine appends to the
    sequence, so it always matches the output so far (recompute after preemption keeps the output).
    ``masking``, ``also_allowed``, ``gating``: what a grammar gated by a reasoning block changes
    (``reasoning_gate.GatedGrammar``); this one masks every token from the first."""
    masking = True
    also_allowed = None
    gating = False

    def __init__(self, matcher: llguidance.LLMatcher, executor: llguidance.LLExecutor):
        self.matcher = matcher
        self.executor = executor

    def accept(self, token_id: int) -> None:
        self.matcher.consume_token(token_id)

    @property
    def failed(self) -> bool:
        return self.matcher.is_error()

    @property
    def error(self) -> str:
        return self.matcher.get_error()


class GrammarMatchers:
    def __init__(self, tokenizer, vocab_size: int, eos_token_ids):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        self._ll_tokenizer: llguidance.LLTokenizer | None = None
        self._executor: llguidance.LLExecutor | None = None

    def _tokenizer_view(self) -> llguidance.LLTokenizer:
        if self._ll_tokenizer is None:
            backend = getattr(self.tokenizer, "backend", None)
            if backend is None or not hasattr(backend, "to_str"):
                raise ValueError("structured outputs need a Hugging Face 'tokenizers' tokenizer; this model's "
                                 f"tokenizer ({type(self.tokenizer).__name__}) is not one")
            spec = backend.to_str()
            self._ll_tokenizer = _grammar_tokenizer(spec, self.vocab_size, self.eos_token_ids)
            self._executor = llguidance.LLExecutor()
        return self._ll_tokenizer

    def new(self, constraint: Constraint) -> SequenceGrammar:
        """A fresh matcher at the start of the output; ValueError if the constraint does not compile."""
        matcher = llguidance.LLMatcher(self._tokenizer_view(), constraint.grammar(), log_level=0)
        if matcher.is_error():
            raise ValueError(f"invalid {constraint.kind} constraint: {matcher.get_error()[:300]}")
        return SequenceGrammar(matcher, self._executor)


def _grammar_tokenizer(spec: str, vocab_size: int, eos_token_ids: list[int]) -> llguidance.LLTokenizer:
    """llguidance's view of a tokenizer.json, or a ValueError saying what about the tokenizer it cannot use."""
    described = json.loads(spec)
    if described.get("decoder") is None:
        kind = (described.get("model") or {}).get("type", "unknown")
        raise ValueError(
            "structured outputs (response_format, tools, structured_outputs, guided_*) need to know which bytes "
            "each token adds to the text, and this model's tokenizer does not say: its tokenizer.json has no "
            f"decoder (a {kind} tokenizer). Byte-level BPE and SentencePiece tokenizers (every Llama, Mistral, "
            "Qwen and SmolLM tokenizer) have one; serve such a model, or send the request without the constraint")
    try:
        return llguidance.LLTokenizer(spec, n_vocab=vocab_size, eos_token=eos_token_ids or None)
    except ValueError as err:
        raise ValueError(f"structured outputs cannot use this model's tokenizer: the grammar engine (llguidance) "
                         f"refused it ({err}); send the request without the constraint") from err
