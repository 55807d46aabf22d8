"""``Constraint``: what a request's text must match, turned into an llguidance grammar and checked
once, when the request is parsed, so a bad schema or regex is the user's 400 and never the engine's."""
from __future__ import annotations

import json
from dataclasses import dataclass

import llguidance
from llguidance.gbnf_to_lark import any_to_lark

KINDS = ("json", "regex", "choice", "grammar")
# Fixed separators and no free whitespace: a JSON answer cannot wander off into endless blanks, and
# its text is what ``json.dumps`` writes. A schema may still choose otherwise through "x-guidance".
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Constraint:
    kind: str            # one of KINDS
    spec: str            # the JSON schema as JSON text, the regex, the choices as a JSON list, or the grammar
                         # (Lark as llguidance and vLLM take it, or GBNF as llama.cpp takes it)

    @classmethod
    def json_schema(cls, schema: dict | bool) -> "Constraint":
        return cls("json", json.dumps(schema, sort_keys=True))

    @classmethod
    def choice(cls, choices: list[str]) -> "Constraint":
        return cls("choice", json.dumps(list(choices)))

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"constraint kind must be one of {KINDS}, got {self.kind!r}")

    def grammar(self) -> str:
        """The llguidance grammar (JSON text) for this constraint."""
        if self.kind == "json":
            return llguidance.LLMatcher.grammar_from_json_schema(self.spec, defaults=JSON_OPTIONS)
        if self.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(self.spec)
        if self.kind == "choice":
            alternatives = " | ".join(json.dumps(c) for c in json.loads(self.spec))
            return llguidance.LLMatcher.grammar_from_lark(f"start: {alternatives}")
        return llguidance.LLMatcher.grammar_from_lark(any_to_lark(self.spec))     # Lark, or GBNF as llama.cpp takes

    def check(self) -> None:
        """Raise ValueError saying what is wrong if llguidance cannot compile this constraint."""
        try:
            error = llguidance.LLMatcher.validate_grammar(self.grammar())
        except Exception as e:      # noqa: BLE001 - the converters raise plain Exceptions on bad input
            error = str(e)
        if error:
            raise ValueError(f"invalid {self.kind} constraint: {error.strip()[:300]}")
