"""The request fields that constrain the output, as OpenAI and vLLM clients send them, parsed into one
``Constraint``: ``response_format`` (json_object, with llama.cpp's optional ``schema``, / json_schema),
vLLM's ``structured_outputs`` ({json | regex | choice | grammar | json_object}), the older
``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar``, and llama.cpp's top-level
``grammar`` (GBNF) and ``json_schema``. At most one may be given; a schema, regex or grammar that
does not compile is a 400 naming the field it came from.
"""
from __future__ import annotations

import json

from gh200rt.serve.errors import bad_request
from gh200rt.structured import Constraint

GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar",
          "grammar": "grammar", "json_schema": "json"}       # the last two: llama.cpp's names
STRUCTURED_KEYS = ("json", "regex", "choice", "grammar", "json_object")
CONSTRAINT_FIELDS = ("response_format", "structured_outputs", *GUIDED)


def _schema(value, param: str) -> dict | bool:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise bad_request(f"'{param}' is not valid JSON: {e}", param) from None
    if not isinstance(value, (dict, bool)):
        raise bad_request(f"'{param}' must be a JSON schema (an object), got {type(value).__name__}", param)
    return value


def _constraint(kind: str, value, param: str) -> Constraint:
    if kind == "json":
        return Constraint.json_schema(_schema(value, param))
    if kind == "json_object":
        if value is not True:
            raise bad_request(f"'{param}' must be true when given", param)
        return Constraint.json_schema({"type": "object"})
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise bad_request(f"'{param}' must be a non-empty list of non-empty strings", param)
        return Constraint.choice(value)
    if not isinstance(value, str) or not value:
        raise bad_request(f"'{param}' must be a non-empty string", param)
    return Constraint(kind, value)


def _response_format(fmt) -> Constraint | None:
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise bad_request("'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                          "{\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": {...}}}",
                          "response_format")
    if fmt["type"] == "text":
        return None
    if fmt["type"] == "json_object":        # llama.cpp lets json_object carry the schema
        schema = fmt.get("schema")
        return Constraint.json_schema({"type": "object"} if schema is None else _schema(schema, "response_format"))
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or "schema" not in spec:
        raise bad_request("'response_format.json_schema' must be an object with a 'schema'", "response_format")
    return Constraint.json_schema(_schema(spec["schema"], "response_format"))


def parse_constraint(body: dict) -> tuple[Constraint, str] | None:
    """The request's constraint and the field that gave it, or None; checked with the grammar engine."""
    found: list[tuple[Constraint | None, str]] = []
    if body.get("response_format") is not None:
        found.append((_response_format(body["response_format"]), "response_format"))
    structured = body.get("structured_outputs")
    if structured is not None:
        if not isinstance(structured, dict):
            raise bad_request("'structured_outputs' must be an object such as {\"regex\": \"[0-9]+\"}",
                              "structured_outputs")
        keys = [k for k in STRUCTURED_KEYS if structured.get(k) is not None]
        if len(keys) != 1:
            raise bad_request(f"'structured_outputs' needs exactly one of {', '.join(STRUCTURED_KEYS)}; got "
                              f"{keys or 'none'}", "structured_outputs")
        found.append((_constraint(keys[0], structured[keys[0]], "structured_outputs"), "structured_outputs"))
    for field, kind in GUIDED.items():
        if body.get(field) is not None:
            found.append((_constraint(kind, body[field], field), field))
    found = [(c, field) for c, field in found if c is not None]
    if len(found) > 1:
        raise bad_request(f"give one output constraint, not {len(found)}: {', '.join(f for _, f in found)}",
                          found[1][1])
    if not found:
        return None
    constraint, field = found[0]
    try:
        constraint.check()
    except ValueError as e:
        raise bad_request(f"'{field}': {e}", field) from None
    return constraint, field
