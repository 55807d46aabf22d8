"""Errors after which an engine cannot go on (vLLM's ``EngineDeadError``): the server fails what is in flight and
exits non-zero rather than keep answering from a broken engine."""
from __future__ import annotations


class EngineDeadError(RuntimeError):
    """The engine lost a part it cannot run without (e.g. a tensor-parallel rank); close it and start a new one."""
