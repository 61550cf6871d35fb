"""A reply format is chosen by the media types ``Accept`` lists, as HTTP reads that header."""

from __future__ import annotations

import pytest
from cascade.api.accept import accepts
from starlette.requests import Request


def _request(accept: str | None) -> Request:
    headers = [] if accept is None else [(b"accept", line.encode()) for line in accept.split("\n")]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": headers})


@pytest.mark.parametrize(("accept", "wanted"), [
    ("text/event-stream", True),
    ("TEXT/Event-Stream", True),
    ("application/json, text/event-stream;q=0.5", True),
    ("text/event-stream ; charset=utf-8", True),
    ("text/event-stream;q=0", False),
    ("text/event-stream; Q=0.0", False),
    ("application/json", False),
    ("*/*", False),
    ("text/event-streams", False),
    ("", False),
    ("application/json\ntext/event-stream", True),
    (None, False),
])
def test_a_type_is_asked_for_when_listed_with_a_quality_above_zero(accept: str | None, wanted: bool) -> None:
    assert accepts(_request(accept), "text/event-stream") is wanted
