"""Incremental, UTF-8-safe detokenization with stop strings that never leak while streaming.

Text is decoded over a small sliding window of tokens (so a token's leading space or a multi-byte
character split across tokens comes out right); while the window's text ends in U+FFFD (an
incomplete UTF-8 sequence) nothing new is released. ``delta()`` holds back any tail of the text
that could still grow into a stop string; when a stop string appears the text is cut there.
"""
from __future__ import annotations

_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True,
                 stop: list[str] | None = None, include_stop_str_in_output: bool = False):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.stop = list(stop or [])
        self.include_stop = include_stop_str_in_output
        self._tokens = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._tokens)
        self.text = ""
        self.emitted = 0
        self.stopped_by: str | None = None

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add_token(self, token_id: int) -> str | None:
        """Append one generated token; returns the stop string if one now ends the text."""
        self._tokens.append(token_id)
        prefix_text = self._decode(self._tokens[self._prefix_offset:self._read_offset])
        new_text = self._decode(self._tokens[self._prefix_offset:])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return None
        old_len = len(self.text)
        self.text += new_text[len(prefix_text):]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._tokens)
        return self._find_stop(old_len) if self.stop and self.stopped_by is None else None

    def _find_stop(self, old_len: int) -> str | None:
        best: tuple[int, str] | None = None
        for s in self.stop:
            idx = self.text.find(s, max(0, old_len - len(s) + 1))
            if idx >= 0 and (best is None or idx < best[0]):
                best = (idx, s)
        if best is None:
            return None
        idx, s = best
        self.text = self.text[:idx + len(s)] if self.include_stop else self.text[:idx]
        self.stopped_by = s
        return s

    def _held_back(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of some stop string."""
        longest = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self.text)), longest, -1):
                if self.text.endswith(s[:k]):
                    longest = k
                    break
        return longest

    def delta(self, final: bool) -> str:
        """Text not yet released; on the final call everything that remains."""
        end = len(self.text) if final or self.stopped_by else len(self.text) - self._held_back()
        end = max(end, self.emitted)
        out = self.text[self.emitted:end]
        self.emitted = end
        return out
