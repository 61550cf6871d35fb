"""What the clients send again, and what they never do, against a real local HTTP server.

The server is a scripted HTTP/1.1 server on a real socket (h11, as httpx's own stack): each
connection plays the next step of its script — answer 503/429 with ``Retry-After``, reset the
connection before answering, cut a stream half-way, or answer like ``/compress`` (an SSE echo of the
body). The retry policy's arithmetic is a pure core, checked with hypothesis.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import h11
import pytest
from cascade_client import AsyncCascadeClient, CascadeClient, CascadeConnectionError
from cascade_client.protocol import RateLimitError, ServiceUnavailableError
from cascade_client.retry import Attempts, RetryPolicy, retry_after_seconds
from hypothesis import given, settings
from hypothesis import strategies as st

FAST = RetryPolicy(attempts=4, budget_seconds=10, backoff_seconds=0.01, max_backoff_seconds=0.02)


class ScriptedServer:
    """Serves connections one at a time; connection ``i`` plays ``script[i]`` (the last step repeats).

    Steps: ``"ok"`` (200, SSE echo of the body, ``done``), ``"503"``/``"429"`` (error with
    ``Retry-After: 0``), ``"reset"`` (request head read, then RST), ``"cut"`` (200, one chunk event, then
    the connection drops inside the chunked body). ``bodies`` records every body received in full.
    """

    def __init__(self, script: list[str]) -> None:
        self.script = script
        self.bodies: list[bytes] = []
        self.connections = 0
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(8)
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            step = self.script[min(self.connections, len(self.script) - 1)]
            self.connections += 1
            with conn:
                conn.settimeout(10)
                self._play(conn, step)

    def _play(self, conn: socket.socket, step: str) -> None:
        h = h11.Connection(h11.SERVER)
        body = b""
        while True:
            event = h.next_event()
            if event is h11.NEED_DATA:
                h.receive_data(conn.recv(65536))
                continue
            if isinstance(event, h11.Request) and step == "reset":
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return
            if isinstance(event, h11.Data):
                body += bytes(event.data)
            if isinstance(event, h11.EndOfMessage):
                break
        self.bodies.append(body)
        if step in ("503", "429"):
            payload = json.dumps({"error": {"message": "engine is starting", "type": "server_error", "param": None,
                                            "code": "engine_unavailable" if step == "503" else "overloaded"}})
            headers = [("content-type", "application/json"), ("retry-after", "0"),
                       ("content-length", str(len(payload))), ("connection", "close")]
            conn.sendall(h.send(h11.Response(status_code=int(step), headers=headers))
                         + h.send(h11.Data(data=payload.encode())) + h.send(h11.EndOfMessage()))
            return
        stream_headers = [("content-type", "text/event-stream"), ("transfer-encoding", "chunked"),
                          ("connection", "close")]
        head = h.send(h11.Response(status_code=200, headers=stream_headers))
        chunk = _event("chunk", {"seq": 0, "data": base64.b64encode(body).decode()})
        if step == "cut":
            conn.sendall(head + h.send(h11.Data(data=chunk)) + b"400\r\npartial")
            return
        done = _event("done", {"bytes_in": len(body), "bytes_out": len(body), "tokens": 1, "bits_per_byte": 8.0,
                               "seconds": 0.0})
        conn.sendall(head + h.send(h11.Data(data=chunk)) + h.send(h11.Data(data=done)) + h.send(h11.EndOfMessage()))


def _event(name: str, payload: object) -> bytes:
    return f"event: {name}\r\n: a comment\r\ndata: {json.dumps(payload)}\r\n\r\n".encode()


@pytest.fixture
def serve() -> Iterator[type[ScriptedServer]]:
    servers: list[ScriptedServer] = []

    class Started(ScriptedServer):
        def __init__(self, script: list[str]) -> None:
            super().__init__(script)
            servers.append(self)

    yield Started
    for server in servers:
        server.close()


BODY = b"def f():\n    return 1\n" * 500


@pytest.mark.parametrize("first", ["503", "429", "reset"])
def test_sync_client_sends_again_after_busy_answers_and_early_resets(serve: type[ScriptedServer], first: str) -> None:
    server = serve([first, first, "ok"])
    with CascadeClient(server.url, retry=FAST) as client:
        assert client.compress(BODY) == BODY
    assert server.connections == 3 and server.bodies[-1] == BODY


def test_async_client_sends_again_after_busy_answers_and_early_resets(serve: type[ScriptedServer]) -> None:
    server = serve(["503", "reset", "ok"])

    async def run() -> bytes:
        async with AsyncCascadeClient(server.url, retry=FAST) as client:
            return await client.compress(BODY)

    assert asyncio.run(run()) == BODY and server.connections == 3


def test_a_file_source_is_sent_whole_again_on_a_retry(serve: type[ScriptedServer], tmp_path: Path) -> None:
    path = tmp_path / "input.py"
    path.write_bytes(b"#" * 10 + BODY * 20)
    server = serve(["503", "ok"])
    with CascadeClient(server.url, retry=FAST) as client, path.open("rb") as source:
        source.read(10)  # a file is sent from where it stands
        assert client.compress(source) == BODY * 20
    assert server.bodies == [BODY * 20, BODY * 20]


def test_a_read_once_source_is_not_sent_again_once_read(serve: type[ScriptedServer]) -> None:
    server = serve(["503", "ok"])
    with CascadeClient(server.url, retry=FAST) as client, pytest.raises(ServiceUnavailableError) as error:
        client.compress(iter([BODY]))
    assert server.connections == 1 and error.value.attempts == 1 and "cannot be replayed" in error.value.message


def test_giving_up_names_the_attempts_and_keeps_the_type(serve: type[ScriptedServer]) -> None:
    server = serve(["429"])
    with CascadeClient(server.url, retry=FAST) as client, pytest.raises(RateLimitError) as error:
        client.compress(BODY)
    assert error.value.status == 429 and error.value.attempts == 4 and server.connections == 4
    assert "gave up after 4 attempts" in str(error.value)


def test_refused_connections_are_retried_within_the_budget() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with CascadeClient(f"http://127.0.0.1:{port}", retry=FAST) as client, \
            pytest.raises(CascadeConnectionError) as error:
        client.kcbs("x", 2, 2, model="m")
    assert error.value.attempts == 4 and "gave up after 4 attempts" in error.value.message


def test_a_stream_cut_after_it_started_is_an_error_and_never_retried(serve: type[ScriptedServer]) -> None:
    server = serve(["cut", "ok"])
    sink = io.BytesIO()
    with CascadeClient(server.url, retry=FAST) as client, pytest.raises(CascadeConnectionError, match="cut"):
        client.compress_to(sink, BODY)
    assert server.connections == 1

    async def run() -> None:
        async with AsyncCascadeClient(server.url, retry=FAST) as client:
            await client.compress(BODY)

    server.connections, server.script = 0, ["cut", "ok"]
    with pytest.raises(CascadeConnectionError, match="cut"):
        asyncio.run(run())
    assert server.connections == 1


def test_cli_reports_a_cut_stream_and_leaves_no_output_file(serve: type[ScriptedServer], tmp_path: Path) -> None:
    server = serve(["cut"])
    source = tmp_path / "input.py"
    source.write_bytes(BODY)
    result = subprocess.run([sys.executable, "-m", "cascade_client", "--server", server.url, "compress", str(source)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "cut before its 'done' event" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["input.py"]


# --------------------------------------------------------------------------- the policy (pure)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@settings(max_examples=300, deadline=None)
@given(attempts=st.integers(1, 8), budget=st.floats(0, 120), backoff=st.floats(0, 5), cap=st.floats(0, 20),
       max_retry_after=st.floats(0, 60), answers=st.lists(st.one_of(st.none(), st.floats(0, 100)), max_size=12),
       rand=st.floats(0, 1))
def test_retry_waits_stay_within_attempts_and_time_and_honour_retry_after(
        attempts: int, budget: float, backoff: float, cap: float, max_retry_after: float,
        answers: list[float | None], rand: float) -> None:
    policy = RetryPolicy(attempts, budget, backoff, cap, max_retry_after)
    clock = Clock()
    state = Attempts(policy, clock, rand=lambda: rand)
    for retry_after in answers:
        delay = state.wait(retry_after)
        if delay is None:
            break
        assert delay == retry_after if retry_after is not None else 0 <= delay <= cap
        clock.now += delay
    assert state.made <= attempts and clock.now <= budget


def test_backoff_doubles_up_to_its_cap_without_jitter() -> None:
    policy = RetryPolicy(backoff_seconds=0.5, max_backoff_seconds=3, jitter=False)
    assert [policy.backoff(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after_seconds({"retry-after": "7"}) == 7.0
    assert retry_after_seconds({"retry-after": "Wed, 21 Oct 2015 07:28:10 GMT"}, now=lambda: 1445412480.0) == 10.0
    assert retry_after_seconds({"retry-after": "soon"}) is None and retry_after_seconds({}) is None
