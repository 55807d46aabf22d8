"""Reasoning parsers: a thinking model's ``<think>`` block split from its answer, with vLLM's ``--reasoning-parser``
names, returned as ``reasoning`` and ``reasoning_content`` beside ``content``.

* ``deepseek_r1`` (DeepSeek-R1, V3.1 / V3.2 in thinking mode, Qwen3 "Thinking-2507", Kimi-K2-Thinking): the
  template opens the block in the prompt, so the answer starts inside it; everything up to ``</think>`` is reasoning
  (an answer that never closes it, cut by ``max_tokens``, is all reasoning). A ``<think>`` the model writes itself
  is dropped.
* ``qwen3`` and ``glm45`` (Qwen3 hybrid models, GLM-4.5 / 4.6): the model opens the block itself when it thinks; an
  answer that starts with ``<think>`` is reasoning up to ``</think>``, any other answer is content (thinking off:
  ``chat_template_kwargs: {"enable_thinking": false}``).

Both names are sent: vLLM answers with ``reasoning`` since late 2025, DeepSeek's API and most clients read
``reasoning_content``. A stream holds back only text that may be the start of a tag. A constrained answer (a JSON
schema, a required tool call) keeps its block: the grammar holds from the token after ``</think>``
(``reasoning_gate``), as vLLM's structured outputs do under a reasoning parser.
"""
from __future__ import annotations

from dataclasses import dataclass

from gh200rt.structured.reasoning_gate import ReasoningGate

START, END = "<think>", "</think>"


@dataclass(frozen=True)
class ReasoningParser:
    name: str
    starts_inside: bool          # the prompt opened the block: the answer begins as reasoning

    def split(self, text: str) -> tuple[str | None, str | None]:
        """(reasoning, content) of a whole answer; None where there is none."""
        stream = ReasoningStream(self)
        reasoning, content = stream.feed(text)
        more_reasoning, more_content = stream.finish()
        reasoning, content = reasoning + more_reasoning, content + more_content
        return (reasoning if stream.reasoned else None), (content or None)


PARSERS = {p.name: p for p in (ReasoningParser("deepseek_r1", True), ReasoningParser("qwen3", False),
                               ReasoningParser("glm45", False))}


def _partial_tag_at_end(text: str, tag: str) -> int:
    """Characters at the end of ``text`` that may begin ``tag`` (held back by a stream)."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class ReasoningStream:
    """One choice's text as it is generated -> (reasoning delta, content delta) per step."""

    def __init__(self, parser: ReasoningParser):
        self.parser = parser
        self.state = "start"          # start: the answer's first characters decide; reasoning; content
        self.pending = ""             # text not sent yet: a possible tag prefix
        self.reasoned = False         # some text was reasoning (even if empty): the answer had a block

    def feed(self, delta: str) -> tuple[str, str]:
        self.pending += delta
        reasoning, content = "", ""
        while True:
            if self.state == "start":
                stripped = self.pending.lstrip()
                if START.startswith(stripped) and len(stripped) < len(START):
                    return reasoning, content          # "<thi": wait
                if stripped.startswith(START):
                    self.pending = stripped[len(START):]
                    self.state, self.reasoned = "reasoning", True
                elif self.parser.starts_inside:
                    self.state, self.reasoned = "reasoning", True
                else:
                    self.state = "content"
                continue
            if self.state == "reasoning":
                end = self.pending.find(END)
                if end >= 0:
                    reasoning += self.pending[:end]
                    self.pending = self.pending[end + len(END):]
                    self.state = "content"
                    continue
                hold = _partial_tag_at_end(self.pending, END)
                reasoning += self.pending[:len(self.pending) - hold]
                self.pending = self.pending[len(self.pending) - hold:]
                return reasoning, content
            content += self.pending
            self.pending = ""
            return reasoning, content

    def finish(self) -> tuple[str, str]:
        """What was held back, once the answer ended: a tag prefix that never completed is text."""
        rest, self.pending = self.pending, ""
        if self.state == "start":                    # the whole answer is a prefix of "<think>"
            if self.parser.starts_inside:
                self.reasoned = True
                return rest, ""
            return "", rest
        return (rest, "") if self.state == "reasoning" else ("", rest)


def reasoning_gate(tokenizer, parser: ReasoningParser) -> ReasoningGate | None:
    """Where a constrained answer's grammar starts under ``parser``: after ``</think>``'s tokens; for a model that
    opens the block itself, also which token opens it (it must be one token, else None: the grammar then holds from
    the first token and the answer has no block)."""
    end = tuple(tokenizer.encode(END, add_special_tokens=False))
    if parser.starts_inside:
        return ReasoningGate(end) if end else None
    start = tokenizer.encode(START, add_special_tokens=False)
    return ReasoningGate(end, start[0]) if end and len(start) == 1 else None


def reasoning_fields(reasoning: str) -> dict:
    return {"reasoning": reasoning, "reasoning_content": reasoning}
