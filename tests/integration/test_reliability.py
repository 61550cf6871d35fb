"""Reliability under faults: aborted streams leak no state, engine death, SIGTERM drain, overload,
and a hostile-input fuzz of ``/decompress`` on the live service."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import signal
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from cascade.codec.container import encode_header, parse_container, varint

from tests.integration.conftest import (
    MODEL,
    Service,
    live_state,
    metric_sum,
    start_service,
    stop_service,
    unfinished_engine_requests,
    wait_for,
    wait_for_async,
    wait_until_idle,
)

PREDICTION = "".join(f"def handler_{i}(event):\n    return {{'id': {i}, 'ok': True}}\n\n" for i in range(40))
CODE = "".join(f"def function_{i}(alpha, beta):\n    total = alpha * {i} + beta\n    return total - {i}\n\n"
               for i in range(30))
LIVE_KINDS = ("runner_requests", "batch_rows", "prediction_states", "prediction_debug_logs",
              "unfinished_requests")


# ---------------------------------------------------------------------------------------------- helpers


def live_total(state: dict[str, Any]) -> int:
    counts = [v for engine in state["engines"].values() for k, v in engine.items() if k in LIVE_KINDS]
    assert all(c >= 0 for c in counts), f"a counter could not be read: {state}"
    return sum(counts) + int(state["gateway"]["kcbs_searches"]) + int(state["gateway"]["codec_jobs"])


def wait_live_zero(service: Service, timeout: float = 60) -> dict[str, Any]:
    """Poll until no live state is left anywhere; returns that state (fails the test after ``timeout``)."""
    last: list[dict[str, Any]] = []

    def zero() -> dict[str, Any] | None:
        last[:] = [live_state(service)]
        return last[0] if live_total(last[0]) == 0 else None

    return wait_for(zero, timeout, "no live state in any engine or the gateway", interval=0.3,
                    detail=lambda: last[0] if last else None)


def engine_core_processes(pid: int) -> list[psutil.Process]:
    """The service's vLLM engine-core child processes (vLLM titles them ``VLLM::EngineCore…``)."""
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if "EngineCore" in " ".join(child.cmdline()) or "EngineCore" in child.name():
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def _seen_while_streaming(client: httpx.Client, service: Service, what: str, read: Callable[[], int],
                          marker: str, **request: Any) -> int:
    """The first non-zero ``read()`` while a ``POST`` of ``request`` streams; the caller then drops it.

    ``marker``: a text the stream's first line must hold (two lines are read before polling). A
    request that ends before a poll sees it (a stalled test process, a fast machine) proves nothing:
    its stream is read to the end and it is made again, at most three times. A stream that ends in an
    error event fails the test with that event and the service's log."""
    finished_first: list[str] = []
    for _ in range(3):
        with client.stream("POST", **request) as r:
            assert r.status_code == 200, r.read()
            lines = r.iter_lines()
            head = _read_some(lines, 2)
            assert marker in head[0], f"{what}: the stream began {head}\n{service.log_tail()}"
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                seen = int(read())
                if seen:
                    return seen
                time.sleep(0.05)
            rest = [line for line in lines if line]
            if time.monotonic() > deadline + 5:
                pytest.fail(f"{what}: it streamed on for 20 s while every poll saw nothing: {rest[-2:]}\n"
                            f"{service.log_tail()}")
        errors = [line for line in rest if line.startswith("event: error") or line.startswith('data: {"error"')]
        assert not errors, f"{what}: the stream failed: {errors}\n{service.log_tail()}"
        finished_first.append(f"{len(head) + len(rest)} lines, ending {rest[-2:]}")
    pytest.fail(f"{what}: it finished before a poll saw it, three times: {finished_first}\n{service.log_tail()}")


def _refuses_connections(port: int) -> bool:
    """True once nothing listens on ``port`` any more."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    return False


def _read_some(lines: Iterator[str], count: int) -> list[str]:
    """The next ``count`` non-empty lines. Takes the caller's iterator: dropping an ``iter_lines()``
    generator closes the connection (the very abort under test), so the caller keeps it alive."""
    seen: list[str] = []
    for line in lines:
        if line:
            seen.append(line)
        if len(seen) >= count:
            break
    return seen


class HeldBody:
    """A JSON request body sent in two parts, the second only once ``release`` is set. Until then the
    request holds its admission slot and reaches no engine: a test that needs requests in flight does
    not race a machine fast enough to finish them first."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.data = json.dumps(body).encode()
        self.release = threading.Event()

    def headers(self, service: Service) -> dict[str, str]:
        return {**service.headers, "content-type": "application/json"}

    def __iter__(self) -> Iterator[bytes]:
        yield self.data[:1]
        self.release.wait(90)
        yield self.data[1:]


def inflight_requests(service: Service) -> float:
    """The gateway's ``cascade_inflight_requests`` gauge: requests holding an admission slot."""
    return metric_sum(service, "cascade_inflight_requests")


# ------------------------------------------------------------------------------- leaks after aborts


def test_aborted_streams_leave_no_live_state_in_engines_or_gateway(service: Service) -> None:
    """Clients that drop chat-with-prediction, /compress, /decompress and k-CBS streams mid-way leave
    no request in any engine, no exact-codec job, no proposer state and no k-CBS search."""
    assert live_total(wait_live_zero(service)) == 0, "the service must start idle for this test"
    with service.client() as client:
        made = client.post("/compress", json={"text": CODE, "lane_tokens": 32})
        assert made.status_code == 200, made.text
        container = made.content
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "write handlers"}], "max_tokens": 600,
            "ignore_eos": True, "temperature": 1.0, "stream": True,
            "prediction": {"type": "content", "content": PREDICTION}}
    compress_body = {"text": CODE * 8, "lane_tokens": 64}  # long enough to be seen coding on a fast machine
    kcbs = {"model": MODEL, "prompt": "import os\n\ndef ", "beam_width": 8, "steps": 60, "stream": True}
    sse = {"accept": "text/event-stream"}
    seen_inside: dict[str, int] = {}
    rounds = 4
    with service.client() as client:
        for i in range(rounds):
            streams = (  # what each stream's live state is seen as, the request, its first event's marker
                ("prediction_states", "the proposer's prediction state while the chat stream runs",
                 lambda: live_state(service)["engines"]["predict"]["prediction_states"],
                 {"url": "/v1/chat/completions", "json": {**chat, "seed": i}}, '"chat.completion.chunk"'),
                ("codec_jobs", "a codec job while /compress streams",
                 lambda: live_state(service)["gateway"]["codec_jobs"],
                 {"url": "/compress", "json": compress_body, "headers": sse}, "event: chunk"),
                ("kcbs_searches", "a k-CBS search while it streams",
                 lambda: live_state(service)["gateway"]["kcbs_searches"],
                 {"url": "/v1/kcbs", "json": kcbs}, '"kcbs.step"'),
            )
            for kind, what, read, request, marker in streams:
                if i == 0:  # the counters see live state while a request runs
                    seen_inside[kind] = _seen_while_streaming(client, service, what, read, marker, **request)
                    continue
                with client.stream("POST", **request) as r:
                    assert r.status_code == 200
                    head = _read_some(r.iter_lines(), 2)
                    assert marker in head[0], head
            with client.stream("POST", "/decompress", content=container,
                               headers={**sse, "content-type": "application/octet-stream"}) as r:
                assert r.status_code == 200
                lines = r.iter_lines()
                assert _read_some(lines, 2)[0] == "event: text"
    # Plain (non-streaming) requests whose client gives up while the engine runs them are aborted too.
    # A request can finish before a poll sees it in an engine (drafts can write a sampled answer in a
    # few steps); that attempt proves nothing, so it is made again, at most three times.
    async def give_up(path: str, body: dict[str, Any]) -> None:
        finished_first: list[str] = []
        async with httpx.AsyncClient(base_url=service.base_url, headers=service.headers, timeout=300) as client:
            for _ in range(3):
                started = time.monotonic()
                task = asyncio.create_task(client.post(path, json=body))
                await wait_for_async(lambda t=task: t.done() or unfinished_engine_requests(service) > 0, 60,
                                     f"the plain {path} request running in an engine", interval=0.05)
                if not task.done():
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    return
                reply = task.result()
                finished_first.append(f"{reply.status_code} after {time.monotonic() - started:.2f}s: "
                                      f"{reply.text[:200]}")
                assert wait_until_idle(service) == 0
        pytest.fail(f"{path} finished before a poll saw it in an engine, three times: {finished_first}")

    for path, body in (("/v1/chat/completions", {**chat, "stream": False}),
                       ("/v1/kcbs", {**kcbs, "stream": False})):
        asyncio.run(give_up(path, body))
    assert seen_inside.keys() == {"prediction_states", "codec_jobs", "kcbs_searches"}, seen_inside
    assert seen_inside["prediction_states"] == seen_inside["kcbs_searches"] == 1, seen_inside
    assert seen_inside["codec_jobs"] >= 1, seen_inside
    assert wait_until_idle(service) == 0
    state = wait_live_zero(service)
    assert live_total(state) == 0, f"live state left after {rounds} rounds of aborted streams: {state}"
    metrics = httpx.get(f"{service.base_url}/metrics", headers=service.headers, timeout=30).text
    assert "cascade_codec_live_jobs 0.0" in metrics
    assert "cascade_kcbs_live_searches 0.0" in metrics


def test_live_state_route_needs_the_api_key(service: Service) -> None:
    assert httpx.get(f"{service.base_url}/ops/live-state", timeout=10).status_code == 401


# ------------------------------------------------------------------------------ /decompress fuzzing


def _header_len(container: bytes) -> int:
    return len(encode_header(parse_container(container).header))


def _with_crc(body: bytes) -> bytes:
    return body + struct.pack("<I", zlib.crc32(body))


def _fuzz_inputs(container: bytes, rng: random.Random) -> Iterator[tuple[str, bytes | dict[str, Any]]]:
    """(kind, raw container bytes or a JSON body) — random, damaged and adversarial inputs."""
    hlen = _header_len(container)
    rest = container[hlen:]
    for n in (0, 1, 3, 4, 5, 16, 64, 300, 5000):
        yield "random", rng.randbytes(n)
    for _ in range(50):
        yield "random", b"CSCZ\x03" + rng.randbytes(rng.randrange(0, 400))
    for _ in range(100):
        flipped = bytearray(container)
        for _ in range(rng.choice((1, 1, 2, 8))):
            flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        yield "bitflip", bytes(flipped)
    for cut in sorted({rng.randrange(len(container)) for _ in range(60)} | {0, 1, hlen - 1, hlen, len(container) - 1}):
        yield "truncated", container[:cut]
    for _ in range(20):
        at = rng.randrange(len(container))
        yield "overwrite", container[:at] + rng.randbytes(rng.randrange(1, 32)) + container[at + 32:]
    yield "trailing", container + b"\x00"
    yield "doubled", container + container
    # Adversarial headers with valid checksums: the reader must check declared sizes, not trust them.
    real = parse_container(container).header

    def header(numerics: bytes = real.numerics.encode(), precision: int = real.precision_bits,
               top_k: int = real.top_k, vocab: int = real.vocab_size, lane: int = real.lane_tokens,
               params: bytes = b'{"separator_id":1}', params_len: int | None = None, context: bytes = b"",
               context_len: int | None = None) -> bytes:
        return _with_crc(b"CSCZ\x03" + real.fingerprint + varint(len(numerics)) + numerics + bytes([precision])
                         + varint(top_k) + varint(vocab) + varint(lane)
                         + varint(len(params) if params_len is None else params_len) + params
                         + varint(len(context) if context_len is None else context_len) + context)

    for params_len in (0xFFFF, 60000, 2, 1 << 40):
        yield "header_params_len", header(params_len=params_len) + rest
    for context_len in (0xFFFFFFFF, 1 << 30, 1 << 21, 7):
        yield "header_context_len", header(context_len=context_len) + rest
    for precision, top_k, vocab, lane in ((0, 64, 8192, 1000), (32, 0, 8192, 1000), (32, 65535, 8192, 1000),
                                          (16, 70000, 80000, 1000), (32, 64, 1, 1000), (32, 64, 1 << 40, 1000),
                                          (24, 8191, 8192, 1000), (32, 64, 8192, 0), (32, 64, 8192, 1 << 40)):
        yield "header_params", header(precision=precision, top_k=top_k, vocab=vocab, lane=lane) + rest
    for params in (b"[" * 4000 + b"]" * 4000, b'{"a": ' + b"9" * 5000 + b"}", b"\xff\xfe", b"null", b'"x"'):
        yield "header_params_json", header(params=params) + rest
    yield "header_numerics", header(numerics=b"\xff\xfe\xfd\xfc") + rest
    yield "header_numerics_other", header(numerics=b"exact-llama-0") + rest
    yield "header_context_utf8", header(context=b"\xff\xff") + rest
    yield "header_varint_too_long", _with_crc(b"CSCZ\x03" + real.fingerprint + b"\xff" * 12) + rest
    # Segment records with hostile declared sizes and valid record checksums.
    for tokens, orig, payload_len in ((5, 10, 0xFFFFFFFF), (5, 0xFFFFFFFF, 4), (0, 4, 4), (0xFFFFFFFF, 4, 4),
                                      (64_000, 70_000, 4), (40, 4, 4)):
        body = bytes([0]) + varint(tokens) + varint(orig) + varint(payload_len) + b"\x00" * min(payload_len, 4)
        yield "segment_sizes", container[:hlen] + _with_crc(body + struct.pack("<I", 0))
    for kind, orig in ((1, 1 << 30), (7, 1)):
        yield "segment_sizes", container[:hlen] + _with_crc(bytes([kind]) + varint(orig) + b"\x00")
    many = container[:hlen] + b"".join(_with_crc(bytes([1]) + varint(1) + b"a") for _ in range(2000))
    yield "many_segments", many + _with_crc(b"E" + varint(2000) + varint(2000))[:-4] + b"\x00\x00\x00\x00"
    yield "trailer_lies", container[:hlen] + _with_crc(b"E" + varint(5) + varint(100))[:-4] + b"\x00" * 4
    # JSON bodies: bad base64, wrong types, unknown fields.
    good_b64 = base64.b64encode(container).decode()
    for data in ("%%%", "QUJD=", good_b64[:-3], good_b64 + "!", "A" * 4001, ""):
        yield "json_base64", {"data": data}
    for body in ({"data": 5}, {"data": None}, {}, {"data": good_b64, "extra": 1}, {"data": good_b64, "model": "x"},
                 {"data": ["a"]}):
        yield "json_shape", body
    for _ in range(30):
        damaged = bytearray(container)
        damaged[rng.randrange(len(damaged))] ^= 0xFF
        yield "json_bitflip", {"data": base64.b64encode(bytes(damaged)).decode()}


def test_decompress_fuzz_answers_4xx_quickly_never_500(service: Service) -> None:
    with service.client() as client:
        made = client.post("/compress", json={"text": 'print("hi")\n' * 8 + "x = 1\n", "lane_tokens": 16})
        assert made.status_code == 200, made.text
        container = made.content
        assert client.post("/decompress", content=container,
                           headers={"content-type": "application/octet-stream"}).status_code == 200
        rng = random.Random(7)
        tried: dict[str, int] = {}
        slowest: dict[str, float] = {}
        for n, (kind, value) in enumerate(_fuzz_inputs(container, rng)):
            use_sse = n % 7 == 0
            headers = {"accept": "text/event-stream"} if use_sse else {}
            started = time.monotonic()
            if isinstance(value, dict):
                r = client.post("/decompress", json=value, headers=headers)
            else:
                r = client.post("/decompress", content=value,
                                headers={**headers, "content-type": "application/octet-stream"})
            elapsed = time.monotonic() - started
            slowest[kind] = max(slowest.get(kind, 0.0), elapsed)
            tried[kind] = tried.get(kind, 0) + 1
            assert r.status_code != 500 and r.status_code < 503, (kind, r.status_code, r.text[:300])
            if r.status_code == 200 and use_sse:
                events = r.text.split("\n\n")
                failed = [e for e in events if e.startswith("event: error")]
                if failed:
                    error = json.loads(failed[0].split("data: ", 1)[1])["error"]
                    assert error["code"] != "internal_error" and 400 <= error["status"] < 500, (kind, error)
            elif r.status_code != 200:
                assert 400 <= r.status_code < 500, (kind, r.status_code)
                assert set(r.json()["error"]) == {"message", "type", "param", "code"}
            assert elapsed < 10, (kind, elapsed)
        total = sum(tried.values())
        print(f"\n/decompress fuzz: {total} inputs {tried}; slowest per kind "
              f"{ {k: round(v, 2) for k, v in slowest.items()} }")
        assert total >= 300
        # A damaged container never produced bytes other than the original's: 200 only for exact copies.
        assert client.post("/decompress", content=container,
                           headers={"content-type": "application/octet-stream"}).status_code == 200
    assert wait_until_idle(service) == 0


# ---------------------------------------------------------------------------- engine death → exit 1


def test_engine_death_fails_inflight_with_503_and_exits_non_zero(tmp_path_factory: pytest.TempPathFactory) -> None:
    svc = start_service(tmp_path_factory.mktemp("kill"), ["--no-enable-predictions", "--no-enable-codec",
                                                          "--max-model-len", "2048"])
    results: list[httpx.Response | Exception] = []
    streamed: list[str] = []
    try:
        cores = engine_core_processes(svc.process.pid)
        assert len(cores) == 1, [c.cmdline() for c in psutil.Process(svc.process.pid).children(recursive=True)]
        # Near the whole context: none of them can finish before the engine is killed.
        body = {"model": MODEL, "prompt": "def f():\n", "max_tokens": 2000, "ignore_eos": True, "temperature": 1.0}

        def plain() -> None:
            try:
                results.append(httpx.post(f"{svc.base_url}/v1/completions", json=body, headers=svc.headers,
                                          timeout=120))
            except httpx.HTTPError as exc:
                results.append(exc)

        def stream() -> None:
            try:
                with httpx.stream("POST", f"{svc.base_url}/v1/completions", json={**body, "stream": True},
                                  headers=svc.headers, timeout=120) as r:
                    for line in r.iter_lines():
                        if line:
                            streamed.append(line)
            except httpx.HTTPError as exc:
                streamed.append(f"transport error: {exc}")

        threads = [threading.Thread(target=plain) for _ in range(3)] + [threading.Thread(target=stream)]
        for t in threads:
            t.start()
        # The kill comes while the stream is early in its 2,000 tokens (it started with the plain three,
        # which generate in step with it), best once /metrics shows all four in the engine; a poll that
        # misses that moment still kills in time, and a plain request that had not reached the engine
        # must get the same 503.
        def data() -> int:
            return sum(line.startswith("data: {") for line in streamed)

        wait_for(lambda: data() > 0, 120, "the stream's first tokens",
                 detail=lambda: ([getattr(r, "status_code", repr(r)) for r in results], streamed[:2]))
        wait_for(lambda: unfinished_engine_requests(svc) >= len(threads) or data() >= 100, 120,
                 "all four requests in the engine or the stream 100 tokens in", interval=0.05)
        assert not results and not any("[DONE]" in line for line in streamed), "a request ended before the kill"
        os.kill(cores[0].pid, signal.SIGKILL)
        for t in threads:
            t.join(timeout=90)
        try:
            ready = httpx.get(f"{svc.base_url}/ready", headers=svc.headers, timeout=5)
            assert ready.status_code == 503 and "engine" in ready.json()["error"]["message"]
        except httpx.TransportError:
            pass  # already gone: also acceptable, the supervisor sees the exit
        code = svc.process.wait(timeout=90)
    finally:
        stop_service(svc)
    assert len(results) == 3
    for r in results:
        assert isinstance(r, httpx.Response), r
        assert r.status_code == 503, r.text
        error = r.json()["error"]
        assert error["code"] == "engine_unavailable" and "engine" in error["message"]
        assert r.headers.get("retry-after")
    errors = [json.loads(line[6:]) for line in streamed if line.startswith("data: {\"error\"")]
    assert errors and errors[0]["error"]["code"] == "engine_unavailable", streamed[-3:]
    assert code != 0, "an engine death must exit non-zero so a supervisor restarts the service"
    log = svc.log_tail(20000)
    assert "stopping the service" in log


# ------------------------------------------------------------ a small-limits service: overload, drain


@pytest.fixture(scope="module")
def tight_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """Tight limits, and a codec whose start-up self-test is made to fail (one service for both: each
    start costs about a minute of CI)."""
    svc = start_service(tmp_path_factory.mktemp("tight"), [
        "--no-enable-predictions", "--codec-selftest-fault", "--max-concurrent-requests", "3",
        "--max-tokens-limit", "300", "--drain-seconds", "60"])
    yield svc
    stop_service(svc)


def test_overload_answers_429_with_retry_after_instead_of_hanging(tight_service: Service) -> None:
    svc = tight_service
    body = {"model": MODEL, "prompt": "def f():\n", "max_tokens": 20}
    held = [HeldBody(body) for _ in range(3)]
    done: list[int] = []

    def hold(request: HeldBody) -> None:
        done.append(httpx.post(f"{svc.base_url}/v1/completions", content=request, headers=request.headers(svc),
                               timeout=120).status_code)

    threads = [threading.Thread(target=hold, args=(request,)) for request in held]
    for t in threads:
        t.start()
    try:
        # The three hold their slots until released, however fast this machine generates: the fourth
        # cannot be answered by a slot coming free, only by the refusal.
        wait_for(lambda: inflight_requests(svc) == 3, 60, "the three requests admitted",
                 detail=lambda: (inflight_requests(svc), done))
        try:
            r = httpx.post(f"{svc.base_url}/v1/completions", json=body, headers=svc.headers, timeout=30)
        except httpx.TimeoutException:
            pytest.fail("the fourth request waited for a slot instead of being refused at once")
        assert not done, done
        assert r.status_code == 429, r.text
        assert r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "overloaded" and r.json()["error"]["type"] == "rate_limit_error"
        assert httpx.get(f"{svc.base_url}/health", timeout=5).status_code == 200  # ops routes are not admitted
    finally:
        for request in held:
            request.release.set()
        for t in threads:
            t.join(timeout=120)
    assert done == [200, 200, 200]
    assert wait_for(lambda: inflight_requests(svc) == 0, 30, "every slot given back")


def test_max_tokens_over_the_configured_limit_is_400(tight_service: Service) -> None:
    r = httpx.post(f"{tight_service.base_url}/v1/completions", headers=tight_service.headers, timeout=30,
                   json={"model": MODEL, "prompt": "x", "max_tokens": 301})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    assert "300" in r.json()["error"]["message"]


def test_failed_self_test_makes_codec_answer_503_and_the_rest_still_serves(tight_service: Service) -> None:
    with tight_service.client() as client:
        r = client.post("/compress", json={"text": "hello"})
        assert r.status_code == 503
        assert "self-test" in r.json()["error"]["message"]
        assert r.headers["retry-after"]
        ok = client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2})
        assert ok.status_code == 200


def test_sigterm_drains_inflight_refuses_new_and_exits_zero(tight_service: Service) -> None:
    """Runs last in this module: it stops the tight service."""
    svc = tight_service
    assert engine_core_processes(svc.process.pid)
    children = psutil.Process(svc.process.pid).children(recursive=True)
    body = {"model": MODEL, "prompt": "def f():\n", "max_tokens": 300, "ignore_eos": True, "temperature": 1.0}
    results: list[dict[str, Any] | str] = []

    def one(stream: bool, request: HeldBody) -> None:
        try:
            if stream:
                with httpx.stream("POST", f"{svc.base_url}/v1/completions", content=request,
                                  headers=request.headers(svc), timeout=120) as r:
                    if r.status_code != 200:
                        results.append({"status": r.status_code, "body": r.read().decode()[:300]})
                        return
                    lines = [line for line in r.iter_lines() if line.startswith("data: {")]
                usage = json.loads(lines[-1][6:])["usage"]
                results.append({"status": r.status_code, "completion_tokens": usage["completion_tokens"]})
            else:
                r = httpx.post(f"{svc.base_url}/v1/completions", content=request, headers=request.headers(svc),
                               timeout=120)
                results.append({"status": r.status_code, "completion_tokens": r.json()["usage"]["completion_tokens"]})
        except Exception as exc:
            results.append(f"{type(exc).__name__}: {exc}")

    # Plain, streamed and plain, every body still arriving when SIGTERM comes: all three are surely in
    # flight, however fast this machine generates, and all three generate during the drain.
    held = [HeldBody(body), HeldBody({**body, "stream": True, "stream_options": {"include_usage": True}}),
            HeldBody(body)]
    threads = [threading.Thread(target=one, args=(i == 1, request)) for i, request in enumerate(held)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: inflight_requests(svc) == len(threads), 60, "the three requests admitted before SIGTERM",
                 detail=lambda: (inflight_requests(svc), results))
        sent = time.monotonic()
        svc.process.send_signal(signal.SIGTERM)
        port = int(svc.base_url.rsplit(":", 1)[1])
        wait_for(lambda: _refuses_connections(port), 30, "the listening socket to close after SIGTERM")
        assert not results, f"a request ended before its body was sent: {results}"
        with pytest.raises(httpx.TransportError):  # the listening socket is closed: new work is refused
            httpx.post(f"{svc.base_url}/v1/completions", json={**body, "max_tokens": 2}, headers=svc.headers,
                       timeout=5)
    finally:
        for request in held:
            request.release.set()
    for t in threads:
        t.join(timeout=120)
    code = svc.process.wait(timeout=120)
    assert results == [{"status": 200, "completion_tokens": 300}] * len(threads), results
    assert code == 0
    assert time.monotonic() - sent < 60
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, f"orphan processes after shutdown: {alive}"
    log = Path(svc.log_path).read_text(errors="replace")
    assert "engines stopped" in log
    # every engine exited within vLLM's grace (none killed), no process's exit printed leak reports, and
    # no output reader took its engine's exit for a failure
    assert "force killing" not in log and "nanobind: leaked" not in log and "output_handler failed" not in log
