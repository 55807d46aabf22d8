"""Suffix decoding (vLLM's ``suffix`` method, after Arctic Inference's SuffixDecoding): drafts from a suffix tree over
the request's own prompt and output and a global one over earlier requests' outputs, so an agent loop or a workflow
that repeats itself drafts what it wrote before, not only what its context holds.

A tree counts, for every path of up to ``max_depth`` tokens, how often it occurred (``SuffixTree``). To draft for a
sequence, each tree finds the longest suffix of the sequence's last ``max_depth`` tokens that is a path in it (the
match), then follows the most frequent continuation while each step's share of its parent's occurrences is at least
``min_token_prob``, for at most ``max_spec_factor`` x the match's length tokens (and k). Each token's probability is
the product of those shares along the way; the draft whose probabilities add up to more (its expected accepted
tokens) is taken, the request's own tree's on a tie.

The global tree holds the outputs of the ``max_cached_requests`` latest finished requests; the oldest's paths are
taken out as a new one comes in. A request's own tokens are not put in a tree: ``TokenHistory`` counts the same
paths on demand over the token array (a few vector passes a step), since counting a prompt into a tree takes
``max_depth`` node steps a token in Python (36 ms for a 1,300-token prompt at depth 24, paid at the request's first
decode step: on an H200 that made the suffix method's decode 0.37x of none on a resident 8B-shaped model).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Node:
    count: int = 0                                  # occurrences of the path from the root to here
    children: dict[int, "Node"] = field(default_factory=dict)


class SuffixTree:
    """Every path of up to ``max_depth`` tokens of the token lists added, with how often each occurred."""

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.root = Node()

    def _add_path(self, tokens: list[int], start: int, end: int, delta: int) -> None:
        node = self.root
        node.count += delta
        for token in tokens[start:end]:
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = Node()
            child.count += delta
            if child.count == 0:
                del node.children[token]
                return
            node = child

    def add(self, tokens: list[int], delta: int = 1) -> None:
        """Count (``delta`` 1) or uncount (-1) every path of ``tokens`` of up to ``max_depth`` tokens."""
        for start in range(len(tokens)):
            self._add_path(tokens, start, min(len(tokens), start + self.max_depth), delta)

    def _find(self, path: list[int]) -> Node | None:
        node = self.root
        for token in path:
            node = node.children.get(token)
            if node is None:
                return None
        return node

    def match(self, context: list[int]) -> tuple[Node | None, int]:
        """The node of the longest suffix of ``context`` (at most ``max_depth`` tokens) that is a path with a
        continuation, and its length; (None, 0) where there is none."""
        for length in range(min(self.max_depth, len(context)), 0, -1):
            node = self._find(context[len(context) - length:])
            if node is not None and node.children:
                return node, length
        return None, 0

    def draft(self, context: list[int], k: int, max_spec_factor: float,
              min_token_prob: float) -> tuple[list[int], float]:
        """The most frequent continuation of ``context``'s longest match, and its expected accepted tokens."""
        node, length = self.match(context)
        if node is None:
            return [], 0.0
        limit = min(k, int(max_spec_factor * length))
        tokens, prob, score = [], 1.0, 0.0
        while len(tokens) < limit and node.children:
            token, child = max(node.children.items(), key=lambda item: (item[1].count, -item[0]))
            share = child.count / node.count
            if share < min_token_prob:
                break
            prob *= share
            tokens.append(token)
            score += prob
            node = child
        return tokens, score


class TokenHistory:
    """A request's prompt and output, drafted from as a suffix tree over them would draft (``SuffixTree.add`` of the
    tokens, then ``draft`` of their last ``max_depth``: the same tokens and scores): the longest suffix of at most
    ``max_depth`` - 1 tokens that occurred earlier with a continuation, then the most frequent continuation of its
    occurrences, counted on the array when asked."""

    def __init__(self, max_depth: int):
        assert max_depth >= 2
        self.max_depth = max_depth
        self._tokens = np.empty(256, dtype=np.int64)
        self.size = 0

    def extend(self, tokens: list[int]) -> None:
        end = self.size + len(tokens)
        if end > len(self._tokens):
            grown = np.empty(max(end, 2 * len(self._tokens)), dtype=np.int64)
            grown[:self.size] = self._tokens[:self.size]
            self._tokens = grown
        self._tokens[self.size:end] = tokens
        self.size = end

    def _match(self) -> tuple[np.ndarray, int]:
        """The end positions of the earlier occurrences of the longest matched suffix, and its length."""
        a, n = self._tokens, self.size
        ends = np.flatnonzero(a[:n - 1] == a[n - 1]) if n >= 2 else np.empty(0, dtype=np.int64)
        if not len(ends):
            return ends, 0
        length = np.ones(len(ends), dtype=np.int64)
        alive = np.arange(len(ends))
        for back in range(1, min(n, self.max_depth - 1)):
            at = ends[alive] - back
            keep = at >= 0
            keep[keep] = a[at[keep]] == a[n - 1 - back]
            alive = alive[keep]
            if not len(alive):
                break
            length[alive] += 1
        longest = int(length.max())
        return ends[length >= longest], longest

    def draft(self, k: int, max_spec_factor: float, min_token_prob: float) -> tuple[list[int], float]:
        """The most frequent continuation of the longest match, and its expected accepted tokens."""
        ends, length = self._match()
        if not length:
            return [], 0.0
        a, n = self._tokens, self.size
        limit = min(k, int(max_spec_factor * length))
        count = len(ends) + 1                  # the suffix itself occurs at the end, with no continuation
        tokens, prob, score, depth = [], 1.0, 0.0, length
        while len(tokens) < limit and depth < self.max_depth:
            nexts = ends + 1
            nexts = nexts[nexts < n]
            if not len(nexts):
                break
            values, counts = np.unique(a[nexts], return_counts=True)
            best = counts.max()
            token = int(values[counts == best].min())         # a tie goes to the smaller id, as the tree's draft
            share = best / count
            if share < min_token_prob:
                break
            prob *= share
            tokens.append(token)
            score += prob
            ends, count, depth = nexts[a[nexts] == token], int(best), depth + 1
        return tokens, score


class SuffixProposer:
    """Drafts for running sequences from their own trees and the global one (``finished`` feeds the latter)."""

    def __init__(self, max_depth: int, max_cached_requests: int, max_spec_factor: float, min_token_prob: float):
        self.max_depth, self.max_spec_factor, self.min_token_prob = max_depth, max_spec_factor, min_token_prob
        self.max_cached_requests = max_cached_requests
        self.global_tree = SuffixTree(max_depth)
        self._cached: deque[list[int]] = deque()
        self._own: dict[str, TokenHistory] = {}     # seq id -> its prompt and output so far

    def propose(self, seq, k: int) -> list[int]:
        tokens = seq.all_token_ids
        history = self._own.get(seq.seq_id)
        if history is None or history.size > len(tokens):
            history = self._own[seq.seq_id] = TokenHistory(self.max_depth)
        if history.size < len(tokens):
            history.extend(tokens[history.size:])
        # the history holds the context itself: its last path occurs there with no continuation, and a match is a
        # suffix that also occurred earlier with one
        own = history.draft(k, self.max_spec_factor, self.min_token_prob)
        shared = self.global_tree.draft(tokens[-self.max_depth:], k, self.max_spec_factor, self.min_token_prob)
        return (shared if shared[1] > own[1] else own)[0]

    def finished(self, output_token_ids: list[int]) -> None:
        """A finished request's output joins the global tree (the oldest leaves it beyond ``max_cached_requests``)."""
        if self.max_cached_requests <= 0 or not output_token_ids:
            return
        tokens = list(output_token_ids)
        self.global_tree.add(tokens)
        self._cached.append(tokens)
        while len(self._cached) > self.max_cached_requests:
            self.global_tree.add(self._cached.popleft(), delta=-1)

    def retain(self, seq_ids: set[str]) -> None:
        for seq_id in [s for s in self._own if s not in seq_ids]:
            del self._own[seq_id]

    @property
    def num_histories(self) -> int:
        return len(self._own)

