"""README.md's HTTP API tables against the server's own declarations (no server, no model): every route the app
registers and every field a parser reads or refuses has a row, and every row names a real route or field.

The field lists come from gh200rt/serve/fields.py (the parsers read bodies through ``declared``, which asserts
that each field they read is declared there), embeddings.FIELDS and the LoRA routes' LOAD_FIELDS / UNLOAD_FIELDS."""
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from gh200rt.serve import embeddings, fields, lora_routes, messages_fields
from gh200rt.serve.api import create_app

README = Path(__file__).resolve().parents[2] / "README.md"

# README heading -> the fields its table must name exactly.
FIELD_TABLES = {
    "Completions and chat completions": set(fields.GENERATION),
    "Completions only": set(fields.COMPLETION_ONLY),
    "Chat completions only": set(fields.CHAT_ONLY),
    "Responses": set(fields.RESPONSES),
    "Embeddings": set(embeddings.FIELDS),
    "/tokenize and /detokenize": set(fields.TOKENIZE) | set(fields.DETOKENIZE),
    "LoRA adapter routes": lora_routes.LOAD_FIELDS | lora_routes.UNLOAD_FIELDS,
    "Anthropic Messages": set(messages_fields.MESSAGES) | set(messages_fields.COUNT_TOKENS),
}


def tables(text: str) -> dict[str, list[list[str]]]:
    """Each ``####`` heading -> the rows (lists of cells) of the first table under it, header and rule left out."""
    result, heading, rows = {}, None, None
    for line in text.splitlines():
        if line.startswith("#"):
            heading, rows = line.lstrip("#").strip(), None
        elif line.startswith("|") and heading is not None and heading not in result:
            rows = [] if rows is None else rows
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            rows.append(cells)
        elif rows is not None:
            result[heading], rows = rows[2:], None
    if rows is not None:
        result[heading] = rows[2:]
    return result


def names(cell: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", cell))


def documented_fields(rows: list[list[str]]) -> set[str]:
    """The first column's names; ``stream_options.include_usage`` stands for ``stream_options`` and its key
    ``include_usage``."""
    found = set()
    for row in rows:
        for name in names(row[0]):
            found.add(name)
            if name.startswith("stream_options."):
                found.update(name.split(".", 1))
    return found


@pytest.fixture(scope="module")
def readme_tables():
    return tables(README.read_text())


def app_routes() -> set[tuple[str, str]]:
    """(method, path) of every route the app registers; ``{name:path}`` written as ``{name}``."""
    app = create_app(SimpleNamespace())        # routes are registered without a model or an engine
    return {(method, re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path))
            for route in app.routes for method in getattr(route, "methods", None) or ()}


def test_every_route_has_a_row(readme_tables):
    rows = readme_tables["Routes"]
    documented = {(method.strip(), path) for row in rows for path in names(row[0]) for method in row[1].split(",")}
    served = app_routes()
    assert served, "the app registered no routes"
    missing = sorted(served - documented)
    assert not missing, f"README.md's Routes table lacks {missing}: add a row saying what gh200rt does with each"
    stale = sorted(documented - served)
    assert not stale, f"README.md's Routes table lists {stale}, which the app does not serve"


@pytest.mark.parametrize("heading", sorted(FIELD_TABLES))
def test_every_field_has_a_row(readme_tables, heading):
    assert heading in readme_tables, f"README.md has no table under a heading {heading!r}"
    declared = FIELD_TABLES[heading]
    documented = documented_fields(readme_tables[heading])
    if heading == "Completions and chat completions":
        declared = declared | set(fields.STREAM_OPTIONS)
    missing = sorted(declared - documented)
    assert not missing, (f"README.md's {heading!r} table lacks {missing}, which the parsers read or refuse: add "
                         "a row saying what gh200rt does with each")
    stale = sorted(n for n in documented - declared if not n.startswith("stream_options."))
    assert not stale, (f"README.md's {heading!r} table names {stale}, which no parser of these routes reads; "
                       "declare them in gh200rt/serve/fields.py or drop the rows")


def test_every_row_says_something(readme_tables):
    for heading in ("Routes", *FIELD_TABLES):
        for row in readme_tables[heading]:
            assert len(row) >= 2 and row[-1], f"{heading!r}: the row {row} says nothing"


def test_completion_and_chat_field_lists_cover_the_shared_ones():
    """The tables split the fields by route; the parsers' lists are their unions."""
    assert set(fields.COMPLETION) == set(fields.GENERATION) | set(fields.COMPLETION_ONLY)
    assert set(fields.CHAT) == set(fields.GENERATION) | set(fields.CHAT_ONLY)


def test_a_parser_cannot_read_an_undeclared_field():
    body = fields.DeclaredBody({"prompt": "x", "secret": 1}, ("prompt",))
    assert body.get("prompt") == "x" and "prompt" in body
    for read in (lambda: body.get("secret"), lambda: body["secret"], lambda: "secret" in body):
        with pytest.raises(AssertionError, match="does not declare"):
            read()


def test_the_parsers_read_only_declared_fields():
    """Every branch that reads a field, taken once: a read of an undeclared field fails here first."""
    from gh200rt.serve.chat_request import parse_chat_request
    from gh200rt.serve.protocol import parse_completion_request
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    parse_completion_request({"prompt": "x", "echo": True, "logprobs": 1, "stream": True,
                              "stream_options": {"include_usage": True}, "truncate_prompt_tokens": 4,
                              "structured_outputs": {"regex": "a+"}, "best_of": 1, "user": "u", "cache_salt": "s",
                              "request_id": "r", "bad_words": ["w"], "metadata": {"k": "v"}, "priority": 0,
                              "safety_identifier": "i", "store": False})
    parse_chat_request({"messages": [{"role": "user", "content": "hi"}], "tools": [tool], "tool_choice": "required",
                        "parallel_tool_calls": False, "logprobs": True, "top_logprobs": 2, "echo": True,
                        "chat_template": "{{ x }}", "chat_template_kwargs": {"enable_thinking": False},
                        "include_reasoning": True})
    embeddings.parse_embedding_request({"input": "x", "dimensions": 8, "user": "u", "truncation_side": "right"})
