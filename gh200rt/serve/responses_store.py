"""The responses /v1/responses keeps: for ``GET /v1/responses/{id}``, ``previous_response_id`` and cancel.

A response made with ``store`` (the default) is kept in memory with its conversation (the chat messages it saw,
instructions left out as OpenAI leaves them out of a continuation, then its own answer) and its input items. The
store is bounded (``--max-stored-responses``): past the bound the least recently used response is forgotten —
created, read or continued counts as a use — and a later ``previous_response_id`` naming it is a 404 that says so.
Nothing survives a restart. While a response is generated it is ``in_flight``: readable (status in_progress) and
cancellable from another request.
"""
from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field

from gh200rt.serve.errors import APIError, bad_request


@dataclass
class StoredResponse:
    body: dict                          # the response object as last sent
    conversation: list[dict]            # chat messages, its answer last
    input_items: list = field(default_factory=list)


@dataclass
class InFlight:
    body: dict                          # the response object at creation (status in_progress)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)


class ResponsesStore:
    def __init__(self, max_stored: int):
        self.max_stored = max_stored
        self._stored: OrderedDict[str, StoredResponse] = OrderedDict()
        self.in_flight: dict[str, InFlight] = {}
        self.evicted = 0

    def keep(self, response_id: str, stored: StoredResponse) -> None:
        self._stored[response_id] = stored
        self._stored.move_to_end(response_id)
        while len(self._stored) > self.max_stored:
            self._stored.popitem(last=False)
            self.evicted += 1

    def get(self, response_id: str) -> StoredResponse:
        stored = self._stored.get(response_id)
        if stored is None:
            raise APIError(404, f"no stored response {response_id!r}: it was made with store false, evicted (this "
                                f"server keeps the {self.max_stored} most recently used, --max-stored-responses), made "
                                f"before the server restarted, or never existed", "response_id", "not_found")
        self._stored.move_to_end(response_id)
        return stored

    def body(self, response_id: str) -> dict:
        if response_id in self.in_flight:
            return self.in_flight[response_id].body
        return self.get(response_id).body

    def history(self, response_id: str | None) -> list[dict] | None:
        """The conversation a request continues with ``previous_response_id`` (a 400 naming it when unknown)."""
        if response_id is None:
            return None
        if not isinstance(response_id, str):
            raise bad_request("'previous_response_id' must be the id of a stored response", "previous_response_id")
        if response_id in self.in_flight:
            raise bad_request(f"response {response_id!r} is still being generated; continue it once it completed",
                              "previous_response_id")
        try:
            return list(self.get(response_id).conversation)
        except APIError as e:
            raise APIError(404, e.message, "previous_response_id", "not_found") from None

    def delete(self, response_id: str) -> None:
        self.get(response_id)
        del self._stored[response_id]

    def cancel(self, response_id: str) -> None:
        flight = self.in_flight.get(response_id)
        if flight is None:
            status = self.get(response_id).body["status"]
            raise bad_request(f"response {response_id!r} is {status}: only a response still being generated can be "
                              f"cancelled", "response_id")
        flight.cancelled.set()
