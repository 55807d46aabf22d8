"""Structured outputs: a request's constraint on its text (JSON schema, regex, choice, grammar).

``Constraint`` is the validated, hashable description a request carries in ``SamplingParams``;
``GrammarMatchers`` (one per engine) compiles it with llguidance into a ``SequenceGrammar`` per
sequence. The sampler masks each constrained row with its grammar's allowed tokens (EOS only where
the grammar accepts), and the engine advances the grammar with every token it appends.
"""
from gh200rt.structured.constraint import Constraint
from gh200rt.structured.matchers import GrammarMatchers, SequenceGrammar

__all__ = ["Constraint", "GrammarMatchers", "SequenceGrammar"]
