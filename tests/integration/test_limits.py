"""Every dimension a request can inflate has a configured limit, enforced before any work starts,
answered with a 4xx in OpenAI's error shape; auth covers every route but ``/health``; keys never
reach a log; CORS is off unless configured.

The limits that need a non-default configuration to be reachable (``max_tokens_limit`` under the
context length, ``max_concurrent_requests``) are tested on the small service in
``test_reliability.py``; the rest run against the shared session service with default settings.
"""

from __future__ import annotations

import logging
import socket
import time
import zlib
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest
from cascade.app import create_app
from cascade.codec.container import ContainerReader, canonical_params, encode_header, parse_container, varint
from cascade.settings import Settings
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from tests.integration.conftest import API_KEY, MODEL, Service

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
KCBS = {"model": MODEL, "prompt": "import os\n", "beam_width": 2, "steps": 2}
S = Settings()


def _assert_openai_error(r: httpx.Response, status: int, param: str | None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param, error
    return dict(error)


# (route, body, param): one request per inflatable dimension, each just over its default limit.
OVER_LIMIT = {
    "n": ("/v1/chat/completions", {**CHAT, "n": S.max_n + 1}, "n"),
    "stop_sequences": ("/v1/chat/completions", {**CHAT, "stop": [f"s{i}" for i in range(S.max_stop_sequences + 1)]},
                       "stop"),
    "top_logprobs": ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": S.max_top_logprobs + 1},
                     "top_logprobs"),
    "completion_logprobs": ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 1,
                                                "logprobs": S.max_top_logprobs + 1}, "logprobs"),
    "max_tokens_over_context": ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": S.max_model_len},
                                "max_tokens"),
    "prompt_tokens_over_context": ("/v1/completions", {"model": MODEL, "prompt": [7] * (S.max_model_len + 1),
                                                       "max_tokens": 1}, "prompt"),
    "prompts_per_request": ("/v1/completions", {"model": MODEL, "prompt": ["a"] * 65, "max_tokens": 1}, "prompt"),
    "prediction_token_ids": ("/v1/chat/completions", {**CHAT, "prediction": {
        "type": "content", "token_ids": [5] * (S.max_prediction_tokens + 1)}}, "prediction"),
    "prediction_text": ("/v1/chat/completions", {**CHAT, "prediction": {
        "type": "content", "content": "x" * (S.max_prediction_tokens * 32 + 1)}}, "prediction"),
    "kcbs_k_squared": ("/v1/kcbs", {**KCBS, "beam_width": 33}, "beam_width"),
    "kcbs_k": ("/v1/kcbs", {**KCBS, "beam_width": 65}, "beam_width"),
    "kcbs_steps": ("/v1/kcbs", {**KCBS, "steps": S.max_kcbs_steps + 1}, "steps"),
    "kcbs_edit_distance": ("/v1/kcbs", {**KCBS, "target": "x", "max_edit_distance": 3}, "max_edit_distance"),
    "kcbs_target": ("/v1/kcbs", {**KCBS, "target": [5] * 6, "max_edit_distance": 1}, "target"),
    "kcbs_rows": ("/v1/kcbs", {**KCBS, "beam_width": 16, "steps": S.max_kcbs_rows // 16 + 1}, "steps"),
    "prompt_chars": ("/v1/completions", {"model": MODEL, "prompt": "x = 1\n" * 1_700_000, "max_tokens": 1}, "prompt"),
    "prompt_list_chars": ("/v1/completions", {"model": MODEL, "prompt": ["x", "y" * 5_000_000], "max_tokens": 1},
                          "prompt"),
    "export_prompt_chars": ("/v1/completions", {"model": MODEL, "prompt": "z" * 5_000_000, "compression": True},
                            "prompt"),
    "chat_chars": ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "a b " * 2_500_000}]},
                   "messages"),
    "kcbs_prompt_chars": ("/v1/kcbs", {**KCBS, "prompt": "q" * 10_000_000}, "prompt"),
    "kcbs_target_chars": ("/v1/kcbs", {**KCBS, "target": "t" * 2_000_000}, "target"),
    "prediction_chars": ("/v1/chat/completions",
                         {**CHAT, "prediction": {"type": "content", "content": "p" * 9_000_000}}, "prediction"),
    "bad_words_count": ("/v1/chat/completions", {**CHAT, "bad_words": [f"w{i}" for i in range(S.max_bad_words + 1)]},
                        "bad_words"),
    "bad_word_chars": ("/v1/chat/completions", {**CHAT, "bad_words": ["b" * (S.max_word_chars + 1)]}, "bad_words"),
    "stop_chars": ("/v1/completions", {"model": MODEL, "prompt": "x", "stop": "s" * (S.max_word_chars + 1)}, "stop"),
    "tokenize_chars": ("/v1/tokenize", {"model": MODEL, "prompt": "k" * (S.max_tokenize_chars + 1)}, "prompt"),
    "codec_top_k": ("/compress", {"text": "x", "top_k": 1025}, "top_k"),
    "codec_context": ("/compress", {"text": "x", "context": "c" * (S.codec_max_context_bytes + 1)}, "context"),
    "codec_lane_tokens": ("/compress", {"text": "x", "lane_tokens": 8}, "lane_tokens"),
    "codec_lanes": ("/compress", {"text": "x", "lanes": 65}, "lanes"),
    "codec_precision": ("/compress", {"text": "x", "precision_bits": 12}, "precision_bits"),
}


@pytest.mark.parametrize("dimension", sorted(OVER_LIMIT))
def test_request_over_a_limit_is_400_in_openai_shape_before_any_work(service: Service, dimension: str) -> None:
    path, body, param = OVER_LIMIT[dimension]
    started = time.monotonic()
    with service.client() as client:
        r = client.post(path, json=body)
    error = _assert_openai_error(r, 400, param)
    assert error["type"] == "invalid_request_error"
    assert time.monotonic() - started < 5, "a limit is checked before the work starts"


def _declare_body(service: Service, path: str, length: int) -> tuple[int, bytes]:
    """Send only the headers of a request declaring ``length`` body bytes; return (status, raw reply)."""
    url = urlparse(service.base_url)
    with socket.create_connection((url.hostname or "127.0.0.1", url.port or 80), timeout=10) as sock:
        sock.sendall((f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {service.api_key}\r\n"
                      f"Content-Type: application/octet-stream\r\nContent-Length: {length}\r\n\r\n").encode())
        reply = b""
        while b"\r\n\r\n" not in reply:
            chunk = sock.recv(4096)
            if not chunk:
                break
            reply += chunk
    return int(reply.split(b" ", 2)[1]), reply


@pytest.mark.parametrize(("path", "limit"), [("/v1/chat/completions", S.max_body_bytes),
                                             ("/v1/kcbs", S.max_body_bytes),
                                             ("/compress", S.codec_max_input_bytes),
                                             ("/decompress", S.codec_max_container_bytes)])
def test_declared_body_over_the_route_limit_is_413_before_upload(service: Service, path: str, limit: int) -> None:
    started = time.monotonic()
    status, reply = _declare_body(service, path, limit + 1)
    assert status == 413, reply
    assert b"retry-after" not in reply.lower()
    assert time.monotonic() - started < 2


@pytest.mark.parametrize(("path", "limit"), [("/v1/chat/completions", S.max_body_bytes),
                                             ("/compress", S.codec_max_input_bytes)])
def test_chunked_body_over_the_limit_is_413_while_reading(service: Service, path: str, limit: int) -> None:
    """Without Content-Length (chunked upload) the limit is counted while the body is read. (A raw
    /compress body is coded while it streams in, so its limit trips only when that many bytes
    have arrived; a JSON body is read whole first.)"""
    def chunks():  # type: ignore[no-untyped-def]
        yield b'{"text": "'
        for _ in range(limit // (1 << 20) + 1):
            yield b"a" * (1 << 20)
        yield b'"}'

    started = time.monotonic()
    with service.client() as client:
        r = client.post(path, content=chunks(), headers={"content-type": "application/json"})
    _assert_openai_error(r, 413, None)
    assert time.monotonic() - started < 30


def _real_header(service: Service) -> bytes:
    with service.client() as client:
        container = client.post("/compress", content=b"x = 1\n", headers={"content-type": "text/plain"}).content
    return encode_header(parse_container(container).header)


def test_container_declaring_huge_sizes_is_400_before_reading_them(service: Service) -> None:
    header = _real_header(service)
    for orig_len, payload_len in ((1 << 31, 4), (4, 0xFFFFFFFF)):
        segment = bytes([0]) + varint(3) + varint(orig_len) + varint(payload_len)
        with service.client() as client:
            r = client.post("/decompress", content=header + segment,
                            headers={"content-type": "application/octet-stream"})
        assert _assert_openai_error(r, 400, None)["code"] == "container_too_large"
    params = canonical_params(ContainerReader().feed(header)[0].params)  # type: ignore[union-attr]
    body = header[:header.index(params) - len(varint(len(params)))]
    forged = body + varint(len(params)) + params + varint(S.codec_max_context_bytes + 1)
    with service.client() as client:
        r = client.post("/decompress", content=forged, headers={"content-type": "application/octet-stream"})
    assert _assert_openai_error(r, 400, None)["code"] == "container_too_large"
    crc_ok = zlib.crc32(header[:-4]).to_bytes(4, "little") == header[-4:]
    assert crc_ok


# -------------------------------------------------------------------------------------- auth, CORS


def _app(**settings: Any) -> TestClient:
    """The real app without starting engines (no lifespan): enough for middleware behaviour."""
    return TestClient(create_app(Settings(**settings)), raise_server_exceptions=False)


def _all_routes(client: TestClient) -> list[tuple[str, str]]:
    routes = []
    for route in client.app.routes:  # type: ignore[attr-defined]
        methods = sorted(getattr(route, "methods", None) or {"GET"})
        path = getattr(route, "path", "")
        routes += [(method, path) for method in methods]
    assert any(isinstance(r, APIRoute) for r in client.app.routes)  # type: ignore[attr-defined]
    return routes


def test_every_route_but_health_needs_the_api_key() -> None:
    client = _app(api_key="s3cret-key-value")
    routes = _all_routes(client)
    assert {("POST", "/v1/chat/completions"), ("POST", "/compress"), ("GET", "/metrics"),
            ("GET", "/ops/live-state"), ("GET", "/ready"), ("GET", "/openapi.json"), ("HEAD", "/v1/models"),
            ("HEAD", "/metrics")} <= set(routes)
    for method, path in routes:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-key-value"},
                        {"Authorization": "Basic s3cret-key-value"}):
            r = client.request(method, path, headers=headers)
            if path == "/health":
                assert r.status_code == 200
            else:
                assert r.status_code == 401, (method, path, headers, r.status_code)
                assert method == "HEAD" or r.json()["error"]["type"] == "authentication_error"
                assert r.headers["www-authenticate"] == "Bearer"
    ok = client.get("/ready", headers={"Authorization": "Bearer s3cret-key-value"})
    assert ok.status_code == 503  # authorised; no engine in this test


def test_api_key_never_reaches_a_log_or_a_repr(caplog: pytest.LogCaptureFixture) -> None:
    key = "s3cret-key-value"
    client = _app(api_key=key, log_level="debug")
    with caplog.at_level(logging.DEBUG):
        client.get("/ready", headers={"Authorization": f"Bearer {key}"})
        client.get("/ready", headers={"Authorization": f"Bearer {key}-wrong"})
        client.post("/v1/completions", headers={"Authorization": f"Bearer {key}"}, content=b"{")
    assert caplog.records, "the access log is written"
    for record in caplog.records:
        assert key not in repr(record.__dict__)
    assert key not in repr(Settings(api_key=key)) and key not in str(Settings(api_key=key).model_dump())


def test_session_service_log_holds_no_api_key(service: Service) -> None:
    with service.client() as client:
        client.get("/v1/models")
    httpx.get(f"{service.base_url}/v1/models", headers={"Authorization": f"Bearer {API_KEY}-wrong"})
    assert API_KEY not in service.log_tail(10_000_000)


def test_cors_is_off_unless_origins_are_configured() -> None:
    preflight = {"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}
    client = _app()
    for r in (client.options("/v1/chat/completions", headers=preflight),
              client.get("/health", headers={"Origin": "https://evil.example"})):
        assert "access-control-allow-origin" not in r.headers
    configured = _app(cors_origins=["https://ok.example"])
    r = configured.options("/v1/chat/completions", headers={**preflight, "Origin": "https://ok.example"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://ok.example"
    r = configured.options("/v1/chat/completions", headers=preflight)
    assert r.headers.get("access-control-allow-origin") != "https://evil.example"


@pytest.mark.parametrize("rid", ["../../etc/passwd", "a/b", "x" * 65, ".hidden", "a\tb"])
def test_unsafe_request_ids_are_replaced_in_responses(rid: str) -> None:
    r = _app().get("/health", headers={"X-Request-Id": rid})
    assert r.headers["x-request-id"] != rid and r.headers["x-request-id"].isalnum()
    assert _app().get("/health", headers={"X-Request-Id": "req-7.a_b"}).headers["x-request-id"] == "req-7.a_b"


def test_chunked_body_over_the_limit_is_413_even_when_the_handler_parses_it() -> None:
    """FastAPI reports a body it could not read as a 400 parse error; the limit must still read 413."""
    def chunks():  # type: ignore[no-untyped-def]
        yield b'{"model": "m", "messages": [{"role": "user", "content": "'
        yield from (b"a" * 500 for _ in range(10))
        yield b'"}]}'

    r = _app(max_body_bytes=1024).post("/v1/chat/completions", content=chunks(),
                                      headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
