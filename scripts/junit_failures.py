"""The failing tests of a pytest junit XML (``pytest --junit-xml``): each test id with its first error line.

scripts/validate_report.py lists them in the report of scripts/validate_gpu.py. A file whose XML is damaged
(text edited after the run, such as a path replaced by an unescaped ``<checkout>``) is read line by line
instead: the attributes this needs stay escaped, so the same ids and lines come out.
"""
from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET
from pathlib import Path

FIRST_LINE_CHARS = 300
_CASE = re.compile(r"<testcase\b([^>]*?)(/>|>(.*?)</testcase>)", re.S)
_PROBLEM = re.compile(r"<(failure|error)\b([^>]*?)(?:/>|>(.*?)</\1>)", re.S)
_ATTR = re.compile(r'(\w+)="([^"]*)"')


def case_id(classname: str, name: str) -> str:
    """``tests.gpu.test_x`` + ``test_y[a]`` -> ``tests/gpu/test_x.py::test_y[a]`` (classes: ``::TestZ::``)."""
    if not classname:
        return name  # a collection error names the module itself
    parts = classname.split(".")
    classes = []
    while len(parts) > 1 and parts[-1][:1].isupper():
        classes.insert(0, parts.pop())
    return "::".join(["/".join(parts) + ".py", *classes, name])


def first_line(message: str | None, text: str | None) -> str:
    """The message's first non-empty line; without one, the traceback's first ``E`` line (pytest's marker)."""
    lines = [line.strip() for line in (message or "").splitlines() if line.strip()]
    if not lines:
        errors = [line[1:].strip() for line in (text or "").splitlines() if line.startswith("E ")]
        lines = errors or [line.strip() for line in (text or "").splitlines() if line.strip()] or ["(no message)"]
    line = lines[0]
    return line if len(line) <= FIRST_LINE_CHARS else line[:FIRST_LINE_CHARS - 3] + "..."


def _from_tree(root: ET.Element) -> list[dict]:
    found = []
    for case in root.iter("testcase"):
        for problem in case:
            if problem.tag in ("failure", "error"):
                found.append({"id": case_id(case.get("classname", ""), case.get("name", "")), "kind": problem.tag,
                              "first_line": first_line(problem.get("message"), problem.text)})
    return found


def _from_text(text: str) -> list[dict]:
    found = []
    for case in _CASE.finditer(text):
        attrs = {k: html.unescape(v) for k, v in _ATTR.findall(case.group(1))}
        for problem in _PROBLEM.finditer(case.group(3) or ""):
            message = dict(_ATTR.findall(problem.group(2))).get("message")
            found.append({"id": case_id(attrs.get("classname", ""), attrs.get("name", "")), "kind": problem.group(1),
                          "first_line": first_line(html.unescape(message) if message is not None else None,
                                                   html.unescape(problem.group(3) or ""))})
    return found


def failing_tests(path: str | Path) -> list[dict] | None:
    """``[{"id", "kind" (failure | error), "first_line"}]`` in file order; None when there is no file."""
    path = Path(path)
    if not path.is_file():
        return None
    text = path.read_text(errors="replace")
    try:
        return _from_tree(ET.fromstring(text))
    except ET.ParseError:
        return _from_text(text)
