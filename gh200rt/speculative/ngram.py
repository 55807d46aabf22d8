"""Prompt lookup (vLLM's ``ngram`` method): the tokens that followed an earlier occurrence of the sequence's last
n tokens, searched in the prompt and the output so far.

The longest suffix of ``prompt_lookup_max`` down to ``prompt_lookup_min`` tokens that occurred before is taken, at
its latest earlier occurrence (the most recent context is the likeliest to repeat: an edit of a given text, an agent
loop), and the up to k tokens after it are the draft. The search is one vectorised comparison per suffix length over
the sequence's tokens, kept as a NumPy array that only grows (``TokenHistory``).
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


class TokenHistory:
    """A sequence's tokens as an int64 array grown by doubling (``sync`` appends what the list gained)."""

    def __init__(self):
        self.array = np.empty(64, dtype=np.int64)
        self.size = 0

    def sync(self, tokens: list[int]) -> np.ndarray:
        if len(tokens) < self.size:            # a new list (a preempted sequence keeps its tokens: never shorter)
            self.size = 0
        if len(tokens) > len(self.array):
            grown = np.empty(max(len(tokens), 2 * len(self.array)), dtype=np.int64)
            grown[:self.size] = self.array[:self.size]
            self.array = grown
        self.array[self.size:len(tokens)] = tokens[self.size:]
        self.size = len(tokens)
        return self.array[:self.size]


def lookup_draft(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> list[int]:
    """Up to ``k`` tokens following the latest earlier occurrence of the longest suffix of ``tokens`` of
    ``max_n``..``min_n`` tokens; [] where none occurred."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n:]
        # windows that start before the suffix itself and have at least one token after them
        windows = sliding_window_view(tokens[:length - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + n
            return tokens[start:start + k].tolist()
    return []


class NgramProposer:
    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self._histories: dict[str, TokenHistory] = {}

    def propose(self, seq, k: int) -> list[int]:
        history = self._histories.get(seq.seq_id)
        if history is None:
            history = self._histories[seq.seq_id] = TokenHistory()
        return lookup_draft(history.sync(seq.all_token_ids), self.min_n, self.max_n, k)

    def retain(self, seq_ids: set[str]) -> None:
        """Drop the histories of sequences not in ``seq_ids`` (finished, aborted or preempted ones)."""
        for seq_id in [s for s in self._histories if s not in seq_ids]:
            del self._histories[seq_id]

    @property
    def num_histories(self) -> int:
        return len(self._histories)
