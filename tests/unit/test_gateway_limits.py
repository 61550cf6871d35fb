"""The gateway's error path and connection limits, on a real uvicorn server in this process (no
engine: extra routes stand in for handlers that fail or take too long)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from cascade.api.streaming import BodyThenDisconnectResponse, track_end
from cascade.app import create_app
from cascade.engine.types import EngineFailedError
from cascade.http_protocol import HeaderLimits, limited_protocol
from cascade.settings import Settings
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

SETTINGS = {"max_header_bytes": 8192, "max_headers": 40, "header_timeout_seconds": 1.0,
            "body_timeout_seconds": 1.0, "request_timeout_seconds": 2.0}


class EngineGenerateError(Exception):
    """Named like vLLM's: one request's failure, the engine alive."""


def _add_test_routes(app: FastAPI) -> None:
    @app.get("/v1/boom")
    async def boom() -> None:
        raise RuntimeError("a bug")

    @app.get("/v1/generate-failed")
    async def generate_failed() -> None:
        raise EngineGenerateError

    @app.get("/v1/engine-dead")
    async def engine_dead() -> None:
        raise EngineFailedError("the engine died")

    @app.post("/v1/echo")
    async def echo(body: dict[str, Any]) -> dict[str, Any]:
        return body

    @app.post("/v1/raw")
    async def raw(request: Request) -> dict[str, int]:
        return {"bytes": sum([len(chunk) async for chunk in request.stream()])}

    @app.post("/v1/answer-while-reading")
    async def answer_while_reading(request: Request) -> StreamingResponse:
        """Like a raw /compress: the 200 and a first part go out while the upload still arrives."""
        done = asyncio.Event()

        async def parts() -> AsyncIterator[bytes]:
            yield b"header"
            async for chunk in track_end(request.stream(), done):
                yield chunk[:1]

        return BodyThenDisconnectResponse(parts(), done)

    @app.post("/v1/refuse-by-first-chunk")
    async def refuse_by_first_chunk(request: Request) -> JSONResponse:
        """Like /decompress of a non-container: refused by its first bytes, the rest never read."""
        first = await anext(aiter(request.stream()))
        return JSONResponse({"error": {"message": f"{first!r} is not a container"}}, status_code=400)

    @app.get("/v1/slow")
    async def slow() -> dict[str, str]:
        await asyncio.sleep(30)
        return {"late": "yes"}

    @app.get("/v1/slow-stream")
    async def slow_stream() -> StreamingResponse:
        async def events() -> AsyncIterator[bytes]:
            yield b'data: {"n": 1}\n\n'
            await asyncio.sleep(30)
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, int, FastAPI]]:
    settings = Settings(**SETTINGS)  # type: ignore[arg-type]
    app = create_app(settings)
    _add_test_routes(app)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    limits = HeaderLimits(settings.max_header_bytes, settings.max_headers, settings.header_timeout_seconds)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_level="warning",
                            http=limited_protocol(limits))
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not uv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert uv.started
    yield "127.0.0.1", port, app
    uv.should_exit = True
    thread.join(10)


def _read_reply(sock: socket.socket) -> bytes:
    """One whole response (headers + Content-Length body), or what came before the peer closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(
        b"content-length:")), 0)
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return head + b"\r\n\r\n" + rest


@contextlib.contextmanager
def _connection(server: tuple[str, int, FastAPI], kept_alive: bool) -> Iterator[socket.socket]:
    """A new connection, or one that already carried an answered request (a refusal of the next one
    must still be answered, not read as a response already begun)."""
    with socket.create_connection(server[:2], timeout=10) as sock:
        if kept_alive:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert _status(_read_reply(sock)) == 200
        yield sock


def _status(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1])


def _closed(sock: socket.socket) -> bool:
    sock.settimeout(3)
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, TimeoutError):
        return True


def test_unexpected_error_is_answered_like_any_reply_and_keeps_the_connection(
        server: tuple[str, int, FastAPI]) -> None:
    host, port, app = server
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(b"GET /v1/boom HTTP/1.1\r\nHost: x\r\nX-Request-Id: trace-500\r\n\r\n")
        reply = _read_reply(sock)
        assert _status(reply) == 500 and b"x-request-id: trace-500" in reply.lower(), reply
        assert b'"code":"internal_error"' in reply.replace(b" ", b"")
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _status(_read_reply(sock)) == 200, "the keep-alive connection survives a 500"
    counted = app.state.gateway.metrics.requests.labels("/v1/boom", "GET", "500")._value.get()
    assert counted >= 1


def test_only_a_dead_engine_is_a_503_that_says_restarting(server: tuple[str, int, FastAPI]) -> None:
    host, port, app = server
    base = f"http://{host}:{port}"
    failed = httpx.get(base + "/v1/generate-failed")
    assert failed.status_code == 500 and "retry-after" not in failed.headers
    dead = httpx.get(base + "/v1/engine-dead", headers={"X-Request-Id": "trace-503"})
    assert dead.status_code == 503 and dead.headers["retry-after"] == "10"
    assert dead.headers["x-request-id"] == "trace-503"
    assert app.state.gateway.metrics.requests.labels("/v1/engine-dead", "GET", "503")._value.get() >= 1


@pytest.mark.parametrize("headers", [
    b"X-Big: " + b"a" * 20000 + b"\r\n",
    b"".join(b"X-H%d: v\r\n" % i for i in range(60)),
], ids=["size", "count"])
@pytest.mark.parametrize("kept_alive", [False, True], ids=["fresh", "kept-alive"])
def test_header_limits_answer_431_and_close(server: tuple[str, int, FastAPI], headers: bytes, kept_alive: bool) -> None:
    with _connection(server, kept_alive) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        reply = _read_reply(sock)
        assert _status(reply) == 431, reply[:200]
        assert re.search(rb"\r\nx-request-id: [0-9a-f]{32}\r\n", reply.split(b"\r\n\r\n")[0] + b"\r\n"), reply[:300]
        assert _closed(sock)


def test_a_huge_header_is_refused_while_it_streams_in(server: tuple[str, int, FastAPI]) -> None:
    """64 MB announced: refused after about the limit, not buffered whole."""
    host, port, _ = server
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
        sent = 0
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            for _ in range(64 * 16):
                sock.sendall(b"a" * 65536)
                sent += 65536
        assert sent < 4 << 20


def test_headers_trickled_past_the_deadline_are_408(server: tuple[str, int, FastAPI]) -> None:
    host, port, _ = server
    with socket.create_connection((host, port), timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        reply = _read_reply(sock)
        assert _status(reply) == 408 and time.monotonic() - started < 5
    with socket.create_connection((host, port), timeout=10) as idle:
        assert _closed(idle), "a connection that never sends a request is closed"


def test_a_trickled_body_is_408_and_frees_its_slot(server: tuple[str, int, FastAPI]) -> None:
    host, port, _ = server
    with socket.create_connection((host, port), timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(b"POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{")
        for _ in range(3):
            time.sleep(0.5)
            try:
                sock.sendall(b" ")
            except (BrokenPipeError, ConnectionResetError):
                break
        reply = _read_reply(sock)
        assert _status(reply) == 408, reply
        assert b"body_timeout" in reply and time.monotonic() - started < 5
    assert httpx.post(f"http://{host}:{port}/v1/echo", json={"a": 1}).json() == {"a": 1}


def test_request_past_its_deadline_is_504(server: tuple[str, int, FastAPI]) -> None:
    host, port, _ = server
    started = time.monotonic()
    r = httpx.get(f"http://{host}:{port}/v1/slow", timeout=20)
    assert r.status_code == 504 and r.json()["error"]["code"] == "deadline_exceeded"
    assert "request_timeout_seconds" in r.json()["error"]["message"]
    assert time.monotonic() - started < 5


def test_stream_past_its_deadline_ends_with_an_error_event(server: tuple[str, int, FastAPI]) -> None:
    host, port, _ = server
    with httpx.stream("GET", f"http://{host}:{port}/v1/slow-stream", timeout=20) as r:
        lines = [line for line in r.iter_lines() if line]
    assert r.status_code == 200
    assert '"status": 504' in lines[-2] and lines[-1] == "data: [DONE]", lines


def test_a_slow_but_steady_upload_outlasts_the_body_timeout(server: tuple[str, int, FastAPI]) -> None:
    """Each byte received extends the budget (body_min_rate_bytes): 160 KB over 1.6 s passes a 1 s timeout."""
    host, port, _ = server
    payload = b'{"a": "' + b"x" * (160_000 - 9) + b'"}'
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(b"POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(payload))
        for start in range(0, len(payload), 20_000):
            sock.sendall(payload[start:start + 20_000])
            time.sleep(0.2)
        reply = _read_reply(sock)
    assert _status(reply) == 200, reply[:300]


@pytest.mark.parametrize("path", ["/v1/echo", "/v1/raw", "/v1/answer-while-reading"])
def test_a_client_gone_before_its_body_ended_counts_as_499_never_a_500(
        server: tuple[str, int, FastAPI], path: str, caplog: pytest.LogCaptureFixture) -> None:
    host, port, app = server
    requests = app.state.gateway.metrics.requests
    gone, answered = requests.labels(path, "POST", "499"), requests.labels(path, "POST", "200")
    before, answered_before = gone._value.get(), answered._value.get()
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     "Content-Length: 100000\r\n\r\n{\"a\": \"aaaa".encode())
        time.sleep(0.3)
    deadline = time.monotonic() + 10
    while gone._value.get() == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone._value.get() == before + 1
    assert requests.labels(path, "POST", "500")._value.get() == 0
    assert answered._value.get() == answered_before
    assert "unhandled error" not in caplog.text and "Exception in ASGI application" not in caplog.text


@pytest.mark.parametrize("request_bytes", [
    b"GARBAGE\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header: v\r\n\r\n",
    b"POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
], ids=["request line", "header name", "length and chunked"])
@pytest.mark.parametrize("kept_alive", [False, True], ids=["fresh", "kept-alive"])
def test_a_request_that_cannot_be_parsed_is_a_400_in_openais_shape(server: tuple[str, int, FastAPI],
                                                                    request_bytes: bytes, kept_alive: bool) -> None:
    with _connection(server, kept_alive) as sock:
        sock.sendall(request_bytes)
        reply = _read_reply(sock)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert _status(reply) == 400 and b"content-type: application/json" in head.lower(), reply
    assert json.loads(body)["error"]["code"] == "invalid_http_request"


def test_an_answer_given_before_the_upload_ended_reaches_the_client_whole(server: tuple[str, int, FastAPI]) -> None:
    """Closing with request bytes unread would reset the connection, and a reset can destroy the answer
    on its way: the server sends its answer and a FIN, then reads and drops what still arrives."""
    host, port, _ = server
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(b"POST /v1/refuse-by-first-chunk HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n7\r\ngarbage\r\n")
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
        assert _status(reply) == 400 and b"is not a container" in reply, reply
        for _ in range(64):  # the upload goes on after the answer: each byte is read, none reset
            sock.sendall(b"1000\r\n" + b"x" * 4096 + b"\r\n")
        sock.sendall(b"0\r\n\r\n")
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(1) == b""
