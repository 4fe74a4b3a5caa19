"""Stored `/v1/responses` objects (Hermes' `response_store.db`): LRU of 100, survives restart."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

MAX_STORED_RESPONSES = 100


@dataclass(slots=True)
class StoredResponse:
    """The public object plus what a chained request needs from it."""

    data: dict[str, Any]
    session_id: str
    instructions: str | None


class ResponseStore:
    """Response id → stored response, least recently used evicted first."""

    def __init__(self) -> None:
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._conversations: dict[str, str] = {}

    def get(self, response_id: str) -> StoredResponse | None:
        """The stored response (a read refreshes its LRU position)."""
        item = self._items.get(response_id)
        if item is not None:
            self._items.move_to_end(response_id)
        return item

    def put(self, response_id: str, item: StoredResponse) -> None:
        """Store or replace, evicting beyond the limit."""
        self._items[response_id] = item
        self._items.move_to_end(response_id)
        while len(self._items) > MAX_STORED_RESPONSES:
            self._items.popitem(last=False)

    def delete(self, response_id: str) -> bool:
        """Remove; False when it was not stored."""
        return self._items.pop(response_id, None) is not None

    def conversation(self, name: str) -> str | None:
        """The latest response id of a named conversation."""
        return self._conversations.get(name)

    def set_conversation(self, name: str, response_id: str) -> None:
        """Point a named conversation at its newest response."""
        self._conversations[name] = response_id
