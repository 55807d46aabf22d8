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
taken out as a new one comes in.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


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

    def extend(self, frontier: list[Node], tokens: list[int]) -> list[Node]:
        """Count the paths that end in each of ``tokens``, appended to a token list whose suffixes of 0 to
        ``max_depth`` - 1 tokens end at ``frontier``'s nodes (the root first; ``[self.root]`` for an empty list):
        each path once, one step per node. Returns the new frontier (a request's own tree, as its output grows)."""
        for token in tokens:
            self.root.count += 1
            grown = [self.root]
            for node in frontier[:self.max_depth]:
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = Node()
                child.count += 1
                grown.append(child)
            frontier = grown[:self.max_depth]
        return frontier

    def _find(self, path: list[int]) -> Node | None:
        node = self.root
        for token in path:
            node = node.children.get(token)
            if node is None:
                return None
        return node

    def match(self, context: list[int], frontier: list[Node] | None = None) -> tuple[Node | None, int]:
        """The node of the longest suffix of ``context`` (at most ``max_depth`` tokens) that is a path with a
        continuation, and its length; (None, 0) where there is none. ``frontier``: the nodes of ``context``'s suffixes
        by length (``extend``'s), which spares the walks from the root."""
        if frontier is not None:
            for length in range(len(frontier) - 1, 0, -1):
                if frontier[length].children:
                    return frontier[length], length
            return None, 0
        for length in range(min(self.max_depth, len(context)), 0, -1):
            node = self._find(context[len(context) - length:])
            if node is not None and node.children:
                return node, length
        return None, 0

    def draft(self, context: list[int], k: int, max_spec_factor: float, min_token_prob: float,
              frontier: list[Node] | None = None) -> tuple[list[int], float]:
        """The most frequent continuation of ``context``'s longest match, and its expected accepted tokens."""
        node, length = self.match(context, frontier)
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


class SuffixProposer:
    """Drafts for running sequences from their own trees and the global one (``finished`` feeds the latter)."""

    def __init__(self, max_depth: int, max_cached_requests: int, max_spec_factor: float, min_token_prob: float):
        self.max_depth, self.max_spec_factor, self.min_token_prob = max_depth, max_spec_factor, min_token_prob
        self.max_cached_requests = max_cached_requests
        self.global_tree = SuffixTree(max_depth)
        self._cached: deque[list[int]] = deque()
        # seq id -> (its tree, tokens counted in it, the nodes of its last tokens' suffixes by length)
        self._own: dict[str, tuple[SuffixTree, int, list[Node]]] = {}

    def propose(self, seq, k: int) -> list[int]:
        tokens = seq.all_token_ids
        tree, counted, frontier = self._own.get(seq.seq_id, (None, 0, None))
        if tree is None or counted > len(tokens):
            tree, counted = SuffixTree(self.max_depth), 0
            frontier = [tree.root]
        if counted < len(tokens):
            frontier = tree.extend(frontier, tokens[counted:])
        self._own[seq.seq_id] = (tree, len(tokens), frontier)
        context = tokens[-self.max_depth:]
        # the own tree holds the context itself: its last path occurs there with no continuation, and a match is a
        # suffix that also occurred earlier with one (``match`` passes over paths without children)
        own = tree.draft(context, k, self.max_spec_factor, self.min_token_prob, frontier)
        shared = self.global_tree.draft(context, k, self.max_spec_factor, self.min_token_prob)
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

