"""The client's protocol layer and full-duplex transports, against an in-process fake server.

No engine: the fake ``/compress`` answers like the real one (SSE ``chunk``/``done`` events, read
lazily from the body while it replies), which is all the transport and decoders see.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import uvicorn
from cascade_client import AsyncCascadeClient, AuthenticationError, CascadeClient, CascadeConnectionError
from cascade_client.protocol import (
    IntegrityError,
    ModelMismatchError,
    ServiceUnavailableError,
    error_for,
    error_from_body,
    export_call,
)
from cascade_client.retry import RetryPolicy

EXPANSION = 3  # the fake's reply is larger than its input, like SSE base64 of a poorly compressible file


def _expand(data: bytes) -> bytes:
    """Every byte EXPANSION times: the same result however the body was cut into chunks."""
    return np.repeat(np.frombuffer(data, np.uint8), EXPANSION).tobytes()


def _sse(name: str, payload: Any) -> bytes:
    return f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode()


async def _fake(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Echo each body chunk EXPANSION times as a ``chunk`` event while still reading the body."""
    if scope["type"] != "http":
        return
    if dict(scope["headers"]).get(b"authorization") == b"Bearer wrong":
        body = json.dumps({"error": {"message": "Invalid API key", "type": "authentication_error",
                                     "param": None, "code": "invalid_api_key"}}).encode()
        await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    seq = total = 0
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
        if chunk := message.get("body", b""):
            total += len(chunk)
            data = base64.b64encode(_expand(chunk)).decode()
            await send({"type": "http.response.body", "body": _sse("chunk", {"seq": seq, "data": data}),
                        "more_body": True})
            seq += 1
    if b"verify=true" in scope["query_string"]:  # stands for a segment that fails verification
        await send({"type": "http.response.body", "body": _sse("error", {"error": {
            "message": "segment 0 failed its checksum", "type": "codec_error", "code": "checksum_mismatch"}})})
        return
    done = {"bytes_in": total, "bytes_out": EXPANSION * total, "tokens": 0, "bits_per_byte": 8.0 * EXPANSION,
            "seconds": 0.0}
    await send({"type": "http.response.body", "body": _sse("done", done)})


@pytest.fixture(scope="module")
def fake_server() -> Iterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(_fake, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(10)


# Large enough that the reply overflows every socket buffer long before the upload ends.
BIG = bytes(range(256)) * (32 * 1024)


def test_sync_client_uploads_and_downloads_at_once(fake_server: str) -> None:
    sink = io.BytesIO()
    with CascadeClient(fake_server) as client:
        stats = client.compress_to(sink, io.BytesIO(BIG))
    assert stats.bytes_in == len(BIG) and sink.getvalue() == _expand(BIG)


def test_async_client_uploads_and_downloads_at_once(fake_server: str) -> None:
    async def run() -> bytes:
        sink = io.BytesIO()
        async with AsyncCascadeClient(fake_server) as client:
            await client.compress_to(sink, io.BytesIO(BIG))
        return sink.getvalue()

    assert asyncio.run(run()) == _expand(BIG)


def test_half_duplex_would_deadlock_on_large_inputs(fake_server: str) -> None:
    """Why the duplex transport exists: plain httpx sends all of the body before reading."""
    async def run() -> None:
        async with AsyncCascadeClient(fake_server, duplex=False) as client:
            await asyncio.wait_for(client.compress_to(io.BytesIO(), io.BytesIO(BIG)), 2)

    with pytest.raises(TimeoutError):
        asyncio.run(run())


def test_async_sources_and_sinks(fake_server: str) -> None:
    class Collect:
        def __init__(self) -> None:
            self.parts: list[bytes] = []

        async def write(self, data: bytes) -> None:
            self.parts.append(data)

    async def chunks() -> Any:
        for i in range(0, 200_000, 70_000):
            yield b"x" * min(70_000, 200_000 - i)

    async def run() -> bytes:
        sink = Collect()
        async with AsyncCascadeClient(fake_server) as client:
            await client.compress_to(sink, chunks())
        return b"".join(sink.parts)

    assert asyncio.run(run()) == b"x" * 200_000 * EXPANSION


def test_progress_counts_bytes_both_ways(fake_server: str) -> None:
    class Count:
        sent_bytes = received_bytes = 0

        def sent(self, nbytes: int) -> None:
            self.sent_bytes += nbytes

        def received(self, nbytes: int) -> None:
            self.received_bytes += nbytes

    progress = Count()
    with CascadeClient(fake_server) as client:
        client.compress_to(io.BytesIO(), b"y" * 300_000, progress=progress)
    assert (progress.sent_bytes, progress.received_bytes) == (300_000, 300_000 * EXPANSION)


def test_errors_are_typed_before_and_inside_the_stream(fake_server: str) -> None:
    with CascadeClient(fake_server, "wrong") as client, pytest.raises(AuthenticationError) as info:
        client.compress(BIG)  # the server answers 401 without reading the body: no hang
    assert info.value.status == 401 and info.value.message == "Invalid API key"
    assert info.value.code == "invalid_api_key" and info.value.type == "authentication_error"

    async def stream_error() -> None:
        async with AsyncCascadeClient(fake_server) as client:
            await client.compress_to(io.BytesIO(), b"z" * 10, verify=True)

    with pytest.raises(IntegrityError) as integrity:  # an error event inside a 200 stream
        asyncio.run(stream_error())
    assert integrity.value.status == 422 and integrity.value.code == "checksum_mismatch"
    assert "checksum" in integrity.value.message


def test_unreachable_server_is_a_connection_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with CascadeClient(f"http://127.0.0.1:{port}", retry=RetryPolicy.none()) as client, \
            pytest.raises(CascadeConnectionError):
        client.compress(b"x")

    async def run() -> None:
        async with AsyncCascadeClient(f"http://127.0.0.1:{port}", retry=RetryPolicy.none()) as client:
            await client.compress(b"x")

    with pytest.raises(CascadeConnectionError):
        asyncio.run(run())


def test_error_bodies_map_to_typed_exceptions() -> None:
    body = json.dumps({"error": {"message": "other model", "type": "invalid_request_error",
                                 "param": None, "code": "model_mismatch"}}).encode()
    error = error_from_body(409, body)
    assert isinstance(error, ModelMismatchError) and error.message == "other model"
    plain = error_from_body(502, b"<html>bad gateway</html>")
    assert plain.status == 502 and "bad gateway" in plain.message


def test_stream_errors_take_the_status_they_carry() -> None:
    carried = error_for(0, {"message": "engine died", "code": "some_new_code", "status": 503})
    assert isinstance(carried, ServiceUnavailableError) and carried.status == 503
    older_server = error_for(0, {"message": "bad segment", "code": "checksum_mismatch"})
    assert isinstance(older_server, IntegrityError) and older_server.status == 422


def test_iter_compress_yields_chunks_as_they_arrive(fake_server: str) -> None:
    data = b"q" * 150_000
    with CascadeClient(fake_server) as client:
        assert b"".join(client.iter_compress(data)) == _expand(data)

    async def run() -> bytes:
        async with AsyncCascadeClient(fake_server) as client:
            return b"".join([chunk async for chunk in client.iter_compress(io.BytesIO(data))])

    assert asyncio.run(run()) == _expand(data)


def test_a_failing_source_ends_the_exchange_with_its_own_error(fake_server: str) -> None:
    class Failing(io.RawIOBase):
        calls = 0

        def read(self, size: int = -1) -> bytes:
            self.calls += 1
            if self.calls > 2:
                raise OSError("disk on fire")
            return b"a" * 1000

    with CascadeClient(fake_server) as client, pytest.raises(OSError, match="disk on fire"):
        client.compress(Failing())

    async def run() -> None:
        async with AsyncCascadeClient(fake_server) as client:
            await client.compress(Failing())

    with pytest.raises(OSError, match="disk on fire"):
        asyncio.run(run())


def test_export_k_and_sampling_top_k_are_separate_names() -> None:
    spec = next(export_call("def f():", 50, model="m", top_k=20, temperature=0.5))
    assert spec.json is not None
    assert (spec.json["compression_top_k"], spec.json["top_k"], spec.json["temperature"]) == (50, 20, 0.5)


def test_a_context_utf8_cannot_carry_is_a_bad_request_before_anything_is_sent() -> None:
    from cascade_client import BadRequestError

    with CascadeClient("http://127.0.0.1:9") as client, pytest.raises(BadRequestError) as refused:
        client.compress(b"x", context="a\ud800b")
    assert refused.value.param == "context" and refused.value.code == "invalid_value"
