"""Per-request sampling parameters, validated once with clear ``ValueError``s (vLLM's names)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from gh200rt.structured.constraint import Constraint
from gh200rt.structured.reasoning_gate import ReasoningGate

MAX_LOGPROB_TOKEN_IDS = 128  # vLLM's bound on logprob_token_ids
WHOLE_VOCAB = -1             # logprobs / prompt_logprobs: every token of the vocabulary (bounded by --max-logprobs)
GREEDY_BELOW = 1e-5  # a smaller temperature samples greedily (dividing logits by it would overflow), as in vLLM
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1     # signed 64-bit, as vLLM and torch generators take


@dataclass
class SamplingParams:
    n: int = 1
    max_tokens: int | None = 16          # None: up to the context length
    temperature: float = 1.0             # 0 (or below 1e-5) = greedy
    top_p: float = 1.0
    top_k: int = 0                       # 0 or -1 = off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    repetition_window: int | None = None  # the last N tokens (prompt and output) it covers; None = all of them
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None          # top-k logprobs per generated token (0 = only the sampled one, -1 = all)
    prompt_logprobs: int | None = None
    logprob_token_ids: list[int] | None = None          # logprobs of exactly these ids (and the sampled one) per token
    allowed_token_ids: list[int] | None = None          # sample only among these ids
    skip_special_tokens: bool = True
    logit_bias: dict[int, float] | None = None          # token id -> added to its logit, in [-100, 100] or -inf (ban)
    structured_output: Constraint | None = None         # JSON schema, regex, choice or grammar to follow
    # the constraint holds only after a reasoning block (structured/reasoning_gate.py); None: from the first token
    reasoning_gate: ReasoningGate | None = None
    bad_words: list[str] = field(default_factory=list)  # never generate these words (vLLM's semantics)
    bad_words_token_ids: list[list[int]] | None = None  # their token sequences: ``with_tokenizer`` fills them

    def __post_init__(self):
        if self.reasoning_gate is not None and self.structured_output is None:
            raise ValueError("reasoning_gate delays a structured_output constraint: give one with it")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.bad_words = list(self.bad_words or [])
        if self.top_k == -1:
            self.top_k = 0
        self._validate()

    def _validate(self) -> None:
        def bad(name, value, want):
            raise ValueError(f"{name} must be {want}, got {value!r}")

        if not isinstance(self.n, int) or self.n < 1:
            bad("n", self.n, "an integer of at least 1")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            bad("max_tokens", self.max_tokens, "an integer of at least 1")
        if not 0.0 <= self.temperature <= 100.0:
            bad("temperature", self.temperature, "between 0 and 100 (0 = greedy)")
        if not 0.0 < self.top_p <= 1.0:
            bad("top_p", self.top_p, "in (0, 1]")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            bad("top_k", self.top_k, "0 or -1 (off) or a positive integer")
        if not 0.0 <= self.min_p <= 1.0:
            bad("min_p", self.min_p, "in [0, 1]")
        if not 0.0 < self.repetition_penalty <= 10.0:
            bad("repetition_penalty", self.repetition_penalty, "in (0, 10] (1 = off)")
        if self.repetition_window is not None and (not isinstance(self.repetition_window, int)
                                                   or self.repetition_window < 0):
            bad("repetition_window", self.repetition_window, "0 or more tokens, or None for all of them")
        if not -2.0 <= self.presence_penalty <= 2.0:
            bad("presence_penalty", self.presence_penalty, "in [-2, 2]")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            bad("frequency_penalty", self.frequency_penalty, "in [-2, 2]")
        if self.seed is not None and (not isinstance(self.seed, int) or not SEED_MIN <= self.seed <= SEED_MAX):
            bad("seed", self.seed, f"an integer in [{SEED_MIN}, {SEED_MAX}] (signed 64-bit)")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            bad("min_tokens", self.min_tokens, "0 or more")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            bad("min_tokens", self.min_tokens, f"at most max_tokens ({self.max_tokens})")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < WHOLE_VOCAB):
                bad(name, value, "0 or more, or -1 for the whole vocabulary")
        if self.logprob_token_ids is not None:
            if self.logprobs is None:
                bad("logprob_token_ids", self.logprob_token_ids, "given with logprobs (the sampled token's is returned too)")
            if not 1 <= len(self.logprob_token_ids) <= MAX_LOGPROB_TOKEN_IDS:
                bad("logprob_token_ids", self.logprob_token_ids, f"a list of 1 to {MAX_LOGPROB_TOKEN_IDS} token ids")
        if self.allowed_token_ids is not None and not self.allowed_token_ids:
            bad("allowed_token_ids", self.allowed_token_ids, "a non-empty list of token ids")
        for name in ("logprob_token_ids", "allowed_token_ids"):
            ids = getattr(self, name)
            if ids is not None and any(not isinstance(t, int) or t < 0 for t in ids):
                bad(name, ids, "a list of non-negative token ids")
        if any(not isinstance(s, str) or not s for s in self.stop):
            bad("stop", self.stop, "a list of non-empty strings")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            bad("stop_token_ids", self.stop_token_ids, "a list of non-negative token ids")
        if any(not isinstance(w, str) or not w.strip() for w in self.bad_words):
            bad("bad_words", self.bad_words, "a list of non-blank strings")
        if self.logit_bias is not None and not all(
                isinstance(t, int) and t >= 0 and isinstance(b, (int, float)) and (-100 <= b <= 100 or b == -math.inf)
                for t, b in self.logit_bias.items()):
            bad("logit_bias", self.logit_bias, "a map of token ids to biases in [-100, 100] or -inf (banned)")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    def with_tokenizer(self, encode) -> "SamplingParams":
        """These parameters with ``bad_words`` tokenized (``encode(text)``: ids without special tokens), as vLLM
        does: each word as written (leading spaces stripped) and, where it tokenizes to as many tokens starting
        with another one, with a leading space (the same word in the middle of a text)."""
        if not self.bad_words:
            return self
        sequences = []
        for word in self.bad_words:
            plain = list(encode(word.lstrip()))
            spaced = list(encode(" " + word.lstrip()))
            sequences.append(plain)
            if spaced and len(spaced) == len(plain) and spaced[0] != plain[0]:
                sequences.append(spaced)
        return replace(self, bad_words_token_ids=[ids for ids in sequences if ids])

    def with_vocab(self, vocab_size: int) -> "SamplingParams":
        """These parameters with -1 (the whole vocabulary) in logprobs / prompt_logprobs made ``vocab_size``."""
        whole = {name: vocab_size for name in ("logprobs", "prompt_logprobs") if getattr(self, name) == WHOLE_VOCAB}
        return replace(self, **whole) if whole else self
