"""A grammar that holds only after a thinking model's reasoning block, as vLLM's structured outputs do under a
reasoning parser: the block is free text, the answer after it follows the constraint.

``ReasoningGate(end_ids, start_id)`` says where the block ends (the token ids of ``</think>``) and, for a model that
opens the block itself (Qwen3, GLM-4.5), which single token opens it; ``start_id`` None means the prompt opened it
(DeepSeek-R1's template) and the answer begins inside. ``GatedGrammar`` wraps one sequence's ``SequenceGrammar``:

* ``undecided`` (``start_id`` given, no token yet): the grammar's mask, plus the opening token (``also_allowed``);
  the opening token enters the block, any other token is the answer's first and the grammar consumes it;
* ``reasoning``: no mask (``masking`` False); the end ids, once the output ends with them, start the answer;
* ``answer``: the grammar as it is, over the tokens after the block (the tags never reach the matcher).

While not answering, a sequence drafts nothing (speculative decoding verifies its one token under the state's mask).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReasoningGate:
    end_ids: tuple[int, ...]
    start_id: int | None = None

    def __post_init__(self):
        if not self.end_ids:
            raise ValueError("a reasoning gate needs the token ids that end the reasoning block")


class GatedGrammar:
    def __init__(self, grammar, gate: ReasoningGate):
        self.grammar, self.gate = grammar, gate
        self.state = "undecided" if gate.start_id is not None else "reasoning"
        self._tail: list[int] = []

    # what the mask builders and the step read, as of a SequenceGrammar
    @property
    def matcher(self):
        return self.grammar.matcher

    @property
    def executor(self):
        return self.grammar.executor

    @property
    def failed(self) -> bool:
        return self.grammar.failed

    @property
    def error(self) -> str:
        return self.grammar.error

    @property
    def masking(self) -> bool:
        return self.state != "reasoning"

    @property
    def also_allowed(self) -> int | None:
        """A token allowed beside the grammar's mask: the block's opening token, before the first token."""
        return self.gate.start_id if self.state == "undecided" else None

    @property
    def gating(self) -> bool:
        """Whether the answer has not started (no drafts then)."""
        return self.state != "answer"

    def accept(self, token_id: int) -> None:
        if self.state == "answer":
            self.grammar.accept(token_id)
        elif self.state == "undecided":
            if token_id == self.gate.start_id:
                self.state = "reasoning"
            else:
                self.state = "answer"
                self.grammar.accept(token_id)
        else:
            end = self.gate.end_ids
            self._tail = (self._tail + [token_id])[-len(end):]
            if tuple(self._tail) == end:
                self.state, self._tail = "answer", []
