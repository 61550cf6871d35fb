"""Segmenter: pieces re-join to the input, respect the token limit, and store what cannot round-trip raw."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from cascade.codec.segmenter import Segmenter
from hypothesis import given, settings
from hypothesis import strategies as st


def _encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def _decode(tokens: list[int]) -> str:
    return bytes(tokens).decode("utf-8", "replace")


def _segments(data: bytes, chunk: int, max_tokens: int = 50) -> list:
    async def source() -> AsyncIterator[bytes]:
        for i in range(0, len(data), chunk):
            yield data[i:i + chunk]

    async def collect() -> list:
        return [s async for s in Segmenter(_encode, _decode, max_tokens, 64).segments(source())]

    return asyncio.run(collect())


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=600) | st.text(max_size=300).map(lambda t: t.encode()), st.integers(1, 97))
def test_segments_rejoin_to_the_input_and_fit_the_limit(data: bytes, chunk: int) -> None:
    segments = _segments(data, chunk)
    assert b"".join(s.data for s in segments) == data
    for s in segments:
        if s.tokens is not None:
            assert 0 < len(s.tokens) <= 50
            assert _decode(s.tokens).encode() == s.data


def test_invalid_utf8_is_stored_raw() -> None:
    segments = _segments(b"ok\n\xff\xfe broken\n", 100)
    assert any(s.tokens is None for s in segments)
