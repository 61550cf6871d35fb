"""``cascade_common.sse``: what the encoder writes, the parser reads back, however it is cut."""

from __future__ import annotations

import json
from typing import Any

import pytest
from cascade_common.sse import (
    DONE,
    Event,
    SSEParser,
    data_event,
    encode,
    error_event,
    error_object,
    named_event,
    parse,
)
from hypothesis import given, settings
from hypothesis import strategies as st

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
names = st.just("message") | st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"),
                                     min_size=1, max_size=12)
events = st.one_of(st.builds(Event, names, json_values), st.builds(Event, names, st.none(), st.just(True)))
LINE_ENDS = [b"\n", b"\r\n", b"\r"]


def _stream(items: list[Event], comments: list[bool], line_end: bytes) -> bytes:
    out = b""
    for item, comment in zip(items, comments, strict=False):
        out += (b": keep-alive\n\n" if comment else b"") + encode(item)
    return out.replace(b"\n", line_end)  # data is compact JSON (no raw newline) and names have none


def _cut(data: bytes, points: list[int]) -> list[bytes]:
    cuts = sorted(p % (len(data) + 1) for p in points)
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


@settings(max_examples=150, deadline=None)
@given(st.lists(events, max_size=8), st.lists(st.booleans(), min_size=8, max_size=8),
       st.sampled_from(LINE_ENDS), st.lists(st.integers(0, 10_000), max_size=12))
def test_encoded_events_cut_anywhere_parse_back(items: list[Event], comments: list[bool], line_end: bytes,
                                                points: list[int]) -> None:
    parser = SSEParser()
    parsed = [event for chunk in _cut(_stream(items, comments, line_end), points) for event in parser.feed(chunk)]
    assert parsed == items
    assert parser.close() == []


@settings(max_examples=100, deadline=None)
@given(st.lists(events, min_size=1, max_size=5), st.sampled_from(LINE_ENDS), st.lists(st.integers(0, 10_000),
                                                                                      max_size=6))
def test_a_missing_final_blank_line_leaves_the_last_event_pending(items: list[Event], line_end: bytes,
                                                                  points: list[int]) -> None:
    data = _stream(items, [False] * len(items), line_end)[:-len(line_end)]
    parser = SSEParser()
    parsed = [event for chunk in _cut(data, points) for event in parser.feed(chunk)]
    assert parsed == items[:-1]
    assert parser.close() == items[-1:]
    assert parser.close() == [] and parser.feed(b"") == []


@given(st.lists(events, max_size=6), st.sampled_from(LINE_ENDS))
def test_byte_at_a_time_equals_whole(items: list[Event], line_end: bytes) -> None:
    data = _stream(items, [True] * len(items), line_end)
    parser = SSEParser()
    assert [event for i in range(len(data)) for event in parser.feed(data[i:i + 1])] == parse(data) == items


def test_multiline_data_comments_unknown_fields_and_an_empty_event() -> None:
    stream = (b': hello\r\nid: 7\r\nretry: 10\r\nevent: chunk\r\ndata: {"a":\r\ndata:  [1,\r\ndata:2]}\r\n\r\n'
              b"event: ignored\n\n"  # no data: dispatches nothing and forgets the name
              b"data\n\n"  # a data field without colon is an empty line of data: not JSON
              )
    parser = SSEParser()
    assert parser.feed(stream[:-len(b"data\n\n")]) == [Event("chunk", {"a": [1, 2]})]
    with pytest.raises(ValueError):
        parser.feed(b"data\n\n")


def test_utf8_split_inside_a_character_and_crlf_split_between_chunks() -> None:
    data = named_event("text", {"text": "é☃"}).replace(b"\n", b"\r\n")
    raw = json.dumps({"text": "é☃"}, ensure_ascii=False).encode()
    assert parse(data) == [Event("text", {"text": "é☃"})]
    parser = SSEParser()
    stream = b"data: " + raw + b"\r"
    inside = stream.index("é".encode()) + 1
    pieces = (stream[:inside], stream[inside:inside + 1], stream[inside + 1:], b"", b"\n\r", b"", b"\n")
    events = [event for piece in pieces for event in parser.feed(piece)]
    assert events == [Event("message", {"text": "é☃"})]


def test_wire_bytes_are_the_servers() -> None:
    assert data_event({"b": [1, 2], "a": "x"}) == b'data: {"b":[1,2],"a":"x"}\n\n'
    assert named_event("done", {}) == b"event: done\ndata: {}\n\n"
    assert DONE == b"data: [DONE]\n\n" and encode(Event(done=True)) == DONE
    assert parse(DONE) == [Event("message", None, done=True)]
    assert error_event(503, "down", code="engine_unavailable", type_="service_unavailable") == (
        b'data: {"error":{"message":"down","type":"service_unavailable","param":null,'
        b'"code":"engine_unavailable","status":503}}\n\n')
    assert error_event(422, "bad", code="checksum_mismatch", type_="codec_error", event="error") == (
        b'event: error\ndata: {"error":{"message":"bad","type":"codec_error","param":null,'
        b'"code":"checksum_mismatch","status":422}}\n\n')
    assert error_object(400, "m", param="p")["error"]["param"] == "p"


@pytest.mark.parametrize("name", ["", "a\nb", "a\r"])
def test_event_names_cannot_break_the_framing(name: str) -> None:
    with pytest.raises(ValueError):
        named_event(name, {})


def _roundtrip(value: Any) -> Any:
    return parse(data_event(value))[0].data


@given(json_values)
def test_any_json_value_round_trips(value: Any) -> None:
    assert _roundtrip(value) == value
