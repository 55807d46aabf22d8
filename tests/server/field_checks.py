"""What the request-field tests share: a parser's 400 for a body (no server), and a request to a running server
that must be answered (200) or refused with a 400 naming one field."""
from __future__ import annotations

import pytest

from gh200rt.serve.errors import APIError


def refused_param(parse, body: dict) -> str:
    """The field ``parse(body)`` refuses with a 400."""
    with pytest.raises(APIError) as e:
        parse(body)
    assert e.value.status == 400, e.value.body()
    return e.value.param


def post(server, path: str, body: dict, timeout: float = 120):
    import httpx     # the test extra: imported where a server is called, so parser tests run without it
    return httpx.post(server.url + path, json=body, timeout=timeout)


def ok(server, path: str, body: dict) -> dict:
    r = post(server, path, body)
    assert r.status_code == 200, r.text
    return r.json()


def refused(server, path: str, body: dict, param: str) -> str:
    """The message of the 400 that names ``param``."""
    r = post(server, path, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()
    return r.json()["error"]["message"]
