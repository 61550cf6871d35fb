"""The codec routes' body reader: reads ahead so the disconnect watch can start once the upload ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from cascade.api.streaming import track_end


async def _body(parts: list[bytes], fail: Exception | None = None) -> AsyncIterator[bytes]:
    for part in parts:
        await asyncio.sleep(0)
        yield part
    if fail is not None:
        raise fail


def test_upload_end_is_signalled_before_the_consumer_reaches_it() -> None:
    async def main() -> None:
        done = asyncio.Event()
        stream = track_end(_body([b"a", b"b", b"c"]), done)
        assert await anext(stream) == b"a"
        await asyncio.sleep(0.01)
        assert done.is_set(), "the whole body was read while the consumer still works on the first chunk"
        assert [chunk async for chunk in stream] == [b"b", b"c"]

    asyncio.run(main())


def test_a_body_error_reaches_the_consumer_in_order() -> None:
    async def main() -> None:
        done = asyncio.Event()
        stream = track_end(_body([b"a"], ValueError("too large")), done)
        assert await anext(stream) == b"a"
        with pytest.raises(ValueError, match="too large"):
            await anext(stream)
        assert done.is_set()

    asyncio.run(main())


def test_closing_the_consumer_stops_the_reader() -> None:
    async def main() -> None:
        done = asyncio.Event()

        async def endless() -> AsyncIterator[bytes]:
            while True:
                await asyncio.sleep(0)
                yield b"x"

        stream = track_end(endless(), done)
        assert await anext(stream) == b"x"
        await stream.aclose()
        assert done.is_set()
        await asyncio.sleep(0.01)
        assert len([t for t in asyncio.all_tasks() if not t.done()]) == 1  # only main() is left

    asyncio.run(main())
