"""``AsyncCascadeClient`` against the live service: round trips through file and stream sinks, typed errors."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cascade_client import (
    AsyncCascadeClient,
    AuthenticationError,
    BadRequestError,
    CascadeClient,
    CompressStats,
    NotFoundError,
)

from tests.integration.conftest import Service

TEXT = b"def area(r):\n    return 3.14159 * r * r\n\n\nprint(area(2))\n" * 3


def test_async_round_trip_through_file_sinks(service: Service, tmp_path: Path) -> None:
    source, packed, restored = tmp_path / "in.py", tmp_path / "in.py.cz", tmp_path / "out.py"
    source.write_bytes(TEXT)

    async def run() -> CompressStats:
        async with AsyncCascadeClient(service.base_url, service.api_key) as client:
            with source.open("rb") as src, packed.open("wb") as dst:
                stats = await client.compress_to(dst, src, top_k=64)
            with packed.open("rb") as src, restored.open("wb") as dst:
                result = await client.decompress_to(dst, src)
            assert result.bytes == len(TEXT) and result.verified
            return stats

    stats = asyncio.run(run())
    assert stats.bytes_in == len(TEXT) and stats.bytes_out == packed.stat().st_size
    assert restored.read_bytes() == TEXT


def test_async_and_sync_clients_make_the_same_container(service: Service) -> None:
    async def chunks() -> AsyncIterator[bytes]:  # an async source, cut at odd places
        for i in range(0, len(TEXT), 7):
            yield TEXT[i:i + 7]

    async def run() -> tuple[bytes, bytes]:
        reader = asyncio.StreamReader()
        reader.feed_data(TEXT)
        reader.feed_eof()
        async with AsyncCascadeClient(service.base_url, service.api_key) as client:
            from_stream_reader = await client.compress(reader)
            from_chunks = await client.compress(chunks())
            assert await client.decompress(from_chunks) == TEXT
        return from_stream_reader, from_chunks

    from_reader, from_chunks = asyncio.run(run())
    with CascadeClient(service.base_url, service.api_key) as client:
        assert client.compress(io.BytesIO(TEXT)) == from_reader == from_chunks


def test_async_errors_carry_the_server_message_status_and_type(service: Service) -> None:
    async def run() -> None:
        async with AsyncCascadeClient(service.base_url, service.api_key) as client:
            with pytest.raises(BadRequestError) as bad:
                await client.decompress(b"CSCZ\x01 definitely not a container")
            assert bad.value.status == 400 and "container" in bad.value.message
            with pytest.raises(BadRequestError) as beam:
                await client.kcbs("x", beam_width=99, steps=2)
            assert beam.value.param == "beam_width"
            with pytest.raises(NotFoundError) as model:
                await client.compress(b"x", model="no-such-model")
            assert model.value.status == 404 and model.value.code == "model_not_found"
        async with AsyncCascadeClient(service.base_url, "wrong-key") as client:
            with pytest.raises(AuthenticationError) as auth:
                await client.compress(TEXT * 100)
            assert auth.value.status == 401 and auth.value.message

    asyncio.run(run())


def test_async_kcbs_matches_sync(service: Service) -> None:
    async def run() -> list[str]:
        async with AsyncCascadeClient(service.base_url, service.api_key) as client:
            result = await client.kcbs("import os\n\ndef ", beam_width=2, steps=3)
        return [s.text for s in result.sequences]

    with CascadeClient(service.base_url, service.api_key) as client:
        expected = [s.text for s in client.kcbs("import os\n\ndef ", beam_width=2, steps=3).sequences]
    assert asyncio.run(run()) == expected


def test_async_client_receives_container_chunks_while_still_uploading(service: Service) -> None:
    """Full duplex end to end: the second half of the input is only sent once a coded segment came back."""
    first, second = TEXT * 4, TEXT * 2

    async def run() -> tuple[bytes, int]:
        records = asyncio.Event()
        parts: list[bytes] = []

        class Sink:
            async def write(self, data: bytes) -> None:
                parts.append(data)
                if len(parts) >= 2:  # the header, then a segment's record
                    records.set()

        async def source() -> AsyncIterator[bytes]:
            yield first
            await asyncio.wait_for(records.wait(), 120)  # a half-duplex client would time out here
            yield second

        async with AsyncCascadeClient(service.base_url, service.api_key) as client:
            stats = await client.compress_to(Sink(), source(), lane_tokens=32, lanes=1)
            assert await client.decompress(b"".join(parts)) == first + second
        return b"".join(parts), stats.segments

    container, segments = asyncio.run(run())
    assert container.startswith(b"CSCZ") and segments >= 2
