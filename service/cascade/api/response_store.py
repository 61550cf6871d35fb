"""The Responses API's stored responses (``previous_response_id``, ``GET /v1/responses/{id}``): this
process's memory, bounded in bytes, the oldest dropped first."""

from __future__ import annotations

import json
import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass
class Stored:
    """A stored response: its conversation (chat messages, instructions left out: OpenAI does not carry
    them over) and its body."""

    messages: list[dict[str, Any]]
    body: dict[str, Any]

    def size(self) -> int:
        """Bytes of memory its text takes (Python's size of each string: up to 4 a character, as an emoji
        takes) and of its body as JSON, counting the whole conversation each response keeps (strings an
        earlier response shares are counted again: never less than what is held)."""
        return sum(sys.getsizeof(m["content"]) for m in self.messages) + sys.getsizeof(json.dumps(self.body))


class ResponseStore:
    """The stored responses of this process, the oldest dropped first while they hold more than
    ``budget`` bytes (a conversation continued with ``truncation: "auto"`` grows past the context,
    and each response keeps all of it); one larger than the budget is not kept."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.held = 0
        self._items: OrderedDict[str, tuple[Stored, int]] = OrderedDict()

    def get(self, response_id: str) -> Stored | None:
        entry = self._items.get(response_id)
        return None if entry is None else entry[0]

    def put(self, response_id: str, stored: Stored) -> None:
        size = stored.size()
        if size > self.budget:
            return
        self.delete(response_id)
        self._items[response_id] = (stored, size)
        self.held += size
        while self.held > self.budget:
            _, (_, dropped) = self._items.popitem(last=False)
            self.held -= dropped

    def delete(self, response_id: str) -> bool:
        entry = self._items.pop(response_id, None)
        if entry is not None:
            self.held -= entry[1]
        return entry is not None
