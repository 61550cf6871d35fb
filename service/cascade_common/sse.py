"""Server-Sent Events as Cascade sends them: the encoder, the error event, and the one parser.

Every event's data is one line of compact JSON (``json.dumps`` escapes newlines), so an event is
``data: {...}\\n\\n``, optionally preceded by ``event: NAME\\n``. OpenAI-style streams end with
``data: [DONE]``; the codec's named-event streams end with their ``done`` (or ``error``) event.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

DONE = b"data: [DONE]\n\n"
"""The last event of an OpenAI-style stream."""


def _json(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def data_event(payload: Any) -> bytes:
    """One unnamed ``data:`` event (OpenAI's streaming framing)."""
    return b"data: " + _json(payload) + b"\n\n"


def named_event(name: str, payload: Any) -> bytes:
    """A named event (the codec and k-CBS streams)."""
    if not name or "\n" in name or "\r" in name:
        raise ValueError(f"invalid SSE event name {name!r}")
    return f"event: {name}\n".encode() + data_event(payload)


def error_object(status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type_: str = "server_error") -> dict[str, Any]:
    """The OpenAI error shape a stream sends when it fails after its 200 header went out, plus the
    ``status`` the same failure would have had as a plain reply (clients type the error by it)."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code, "status": status}}


def error_event(status: int, message: str, *, param: str | None = None, code: str | None = None,
                type_: str = "server_error", event: str | None = None) -> bytes:
    """``error_object`` as an event: unnamed (OpenAI-style streams) or named ``event`` (``"error"``
    in the codec's streams)."""
    payload = error_object(status, message, param=param, code=code, type_=type_)
    return data_event(payload) if event is None else named_event(event, payload)


@dataclass(frozen=True)
class Event:
    """One parsed event: its name (``message`` when unnamed) and its JSON data; ``done`` marks
    OpenAI's ``data: [DONE]`` (whose ``data`` is ``None``)."""

    name: str = "message"
    data: Any = None
    done: bool = False


def encode(event: Event) -> bytes:
    """The bytes of ``event`` (the inverse of ``SSEParser``)."""
    if event.done:
        return DONE if event.name == "message" else f"event: {event.name}\n".encode() + DONE
    return data_event(event.data) if event.name == "message" else named_event(event.name, event.data)


_LINE_END = re.compile(rb"\r\n|\r|\n")


class SSEParser:
    """Incremental ``text/event-stream`` parser: feed it bytes as they arrive, get completed events.

    Chunks may be cut anywhere (inside a line, a UTF-8 character or a CRLF). Lines end with LF,
    CRLF or CR (never with the other characters ``str.splitlines`` treats as line breaks); ``:``
    lines are comments; several ``data`` lines join with ``\\n``; ``event`` names the event;
    ``id`` and ``retry`` are ignored. An event is complete at its blank line: one the stream ends
    without stays pending until ``close``. Data must be JSON or ``[DONE]`` (else ``ValueError``).
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._after_cr = False
        self._name = "message"
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[Event]:
        if not chunk:
            return []
        if self._after_cr and chunk[:1] == b"\n":  # the LF of a CRLF cut between two chunks
            chunk = chunk[1:]
        self._after_cr = False
        if not chunk:
            return []
        *lines, self._buffer = _LINE_END.split(self._buffer + chunk)
        self._after_cr = chunk.endswith(b"\r")
        return [event for line in lines if (event := self._line(line)) is not None]

    def close(self) -> list[Event]:
        """Whatever the stream ended with, even without its final blank line; resets the parser."""
        lines, self._buffer, self._after_cr = [self._buffer, b""], b"", False
        return [event for line in lines if (event := self._line(line)) is not None]

    def _line(self, raw: bytes) -> Event | None:
        if not raw:
            return self._dispatch()
        line = raw.decode("utf-8")
        if line.startswith(":"):
            return None
        key, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if key == "event":
            self._name = value or "message"
        elif key == "data":
            self._data.append(value)
        return None

    def _dispatch(self) -> Event | None:
        name, data, had_data = self._name, "\n".join(self._data), bool(self._data)
        self._name, self._data = "message", []
        if not had_data:
            return None
        if data == "[DONE]":
            return Event(name, None, done=True)
        return Event(name, json.loads(data))


def parse(stream: bytes | str) -> list[Event]:
    """Every event of a whole stream (its last event counts even without the final blank line)."""
    parser = SSEParser()
    return [*parser.feed(stream.encode() if isinstance(stream, str) else stream), *parser.close()]
