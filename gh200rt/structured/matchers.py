"""Per-engine llguidance state: the tokenizer view (built on first use, ~0.2 s for a 49k vocabulary),
a thread pool that computes the masks of a batch in parallel, and one matcher per sequence."""
from __future__ import annotations

import llguidance

from gh200rt.structured.constraint import Constraint


class SequenceGrammar:
    """One sequence's grammar state; it advances with every token the engine appends to the
    sequence, so it always matches the output so far (recompute after preemption keeps the output)."""

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
            self._ll_tokenizer = llguidance.LLTokenizer(backend.to_str(), n_vocab=self.vocab_size,
                                                        eos_token=self.eos_token_ids or None)
            self._executor = llguidance.LLExecutor()
        return self._ll_tokenizer

    def new(self, constraint: Constraint) -> SequenceGrammar:
        """A fresh matcher at the start of the output; ValueError if the constraint does not compile."""
        matcher = llguidance.LLMatcher(self._tokenizer_view(), constraint.grammar(), log_level=0)
        if matcher.is_error():
            raise ValueError(f"invalid {constraint.kind} constraint: {matcher.get_error()[:300]}")
        return SequenceGrammar(matcher, self._executor)
