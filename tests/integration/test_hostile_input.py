"""Hostile but valid-JSON input is a cheap, honest 4xx that goes through the gateway like any reply
(request id, metrics), never a 500 and never a false "engine failed" 503."""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import httpx
import pytest
from cascade.codec.container import MAGIC, VERSION, canonical_params, encode_header, parse_container, varint

from tests.integration.conftest import MODEL, Service

SURROGATE = "\ud800"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
KCBS = {"model": MODEL, "prompt": "import os\n", "beam_width": 2, "steps": 2}

HOSTILE: dict[str, tuple[str, dict[str, Any]]] = {
    "model": ("/v1/chat/completions", {**CHAT, "model": SURROGATE}),
    "prompt": ("/v1/completions", {"model": MODEL, "prompt": "x" + SURROGATE, "max_tokens": 1}),
    "prompt_list": ("/v1/completions", {"model": MODEL, "prompt": ["ok", SURROGATE], "max_tokens": 1}),
    "messages": ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": SURROGATE}]}),
    "kcbs_prompt": ("/v1/kcbs", {**KCBS, "prompt": SURROGATE}),
    "kcbs_target": ("/v1/kcbs", {**KCBS, "target": SURROGATE}),
    "tokenize": ("/v1/tokenize", {"model": MODEL, "prompt": SURROGATE}),
    "logit_bias_key": ("/v1/chat/completions", {**CHAT, "logit_bias": {SURROGATE: 1}}),
    "stop": ("/v1/chat/completions", {**CHAT, "stop": [SURROGATE]}),
    "bad_words": ("/v1/chat/completions", {**CHAT, "bad_words": [SURROGATE]}),
    "kcbs_tiny_temperature": ("/v1/kcbs", {**KCBS, "temperature": 5e-324}),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_input_is_400_with_the_request_id(service: Service, case: str) -> None:
    path, body = HOSTILE[case]
    with service.client() as client:
        r = client.post(path, content=json.dumps(body).encode(),  # escaped: httpx's json= cannot encode it
                        headers={"X-Request-Id": f"hostile-{case}", "content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert r.headers["x-request-id"] == f"hostile-{case}"


@pytest.mark.parametrize("top_k", [2**64, 2**70, 10**6])
def test_top_k_beyond_the_vocabulary_means_all_tokens_not_a_dead_engine(service: Service, top_k: int) -> None:
    with service.client() as client:
        r = client.post("/v1/chat/completions", json={**CHAT, "top_k": top_k})
        assert r.status_code == 200, r.text
        assert client.get("/ready").status_code == 200


def test_tokenize_is_its_own_route_in_metrics(service: Service) -> None:
    with service.client() as client:
        assert client.post("/v1/tokenize", json={"model": MODEL, "prompt": "x = 1"}).status_code == 200
        metrics = client.get("/metrics").text
    assert 'cascade_http_requests_total{method="POST",route="/v1/tokenize",status="200"}' in metrics


def test_error_messages_do_not_echo_megabytes(service: Service) -> None:
    with service.client() as client:
        r = client.post("/v1/chat/completions", json={**CHAT, "model": "m" * 1_000_000})
    assert r.status_code == 404 and len(r.content) < 2000


def test_deeply_nested_json_is_400(service: Service) -> None:
    with service.client() as client:
        r = client.post("/v1/chat/completions", content=b"[" * 200_000, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text


def _container_with(container: bytes, params: bytes | None = None, numerics: str | None = None) -> bytes:
    """``container`` with its header's params bytes and/or numerics replaced, every checksum valid."""
    parsed = parse_container(container)
    h = parsed.header
    old_header = len(encode_header(h))
    tail = 1 + len(varint(parsed.trailer.segments)) + len(varint(parsed.trailer.total_original_length)) + 4
    name = (numerics or h.numerics).encode()
    raw = canonical_params(h.params) if params is None else params
    body = (MAGIC + bytes([VERSION]) + h.fingerprint + varint(len(name)) + name + bytes([h.precision_bits])
            + varint(h.top_k) + varint(h.vocab_size) + varint(h.lane_tokens) + varint(len(raw)) + raw
            + varint(len(h.context)) + h.context)
    out = body + struct.pack("<I", zlib.crc32(body)) + container[old_header:len(container) - tail]
    out += b"E" + varint(parsed.trailer.segments) + varint(parsed.trailer.total_original_length)
    return out + struct.pack("<I", zlib.crc32(out))


def _compressed(service: Service, data: bytes) -> bytes:
    with service.client() as client:
        r = client.post("/compress", content=data, headers={"content-type": "text/plain"})
    assert r.status_code == 200, r.text
    return r.content


def _decompressed(service: Service, container: bytes) -> httpx.Response:
    with service.client() as client:
        return client.post("/decompress", content=container, headers={"content-type": "application/octet-stream"})


@pytest.mark.parametrize("params", [b'{"separator_id":NaN}', b'{"separator_id": 1}', b"", b'{"separator_id":0}',
                                    b'{"separator_id":1,"extra":2}'],
                         ids=["nan", "spaced", "empty", "wrong_separator", "extra_key"])
def test_header_params_other_than_the_writers_are_a_422_damaged_container(service: Service, params: bytes) -> None:
    container = _compressed(service, b"x = 1\n")
    assert _decompressed(service, _container_with(container)).content == b"x = 1\n"
    r = _decompressed(service, _container_with(container, params=params))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "damaged_container"
    assert r.json()["error"]["message"].startswith("damaged container")


def test_other_numerics_are_a_409_before_anything_else_is_checked(service: Service) -> None:
    container = _compressed(service, b"x = 1\n")
    for damaged in (_container_with(container, numerics="exact-llama-2"),
                    _container_with(container, numerics="exact-llama-2", params=b""),
                    _container_with(container, numerics="exact-llama-2", params=b"{bad"),
                    _container_with(container, numerics="exact-llama-2", params=b"[1]")):
        r = _decompressed(service, damaged)
        assert r.status_code == 409, r.text
        assert r.json()["error"]["code"] == "numerics_mismatch"
        assert "made under different numerics" in r.json()["error"]["message"]


@pytest.mark.parametrize(("query", "param"), [("lanes=%C2%B2", "lanes"), ("top_k=%D9%A1%D9%A2", "top_k"),
                                              ("verify=banana", "verify"), ("precision_bits=%C2%B3", "precision_bits")])
def test_codec_query_parameters_take_ascii_digits_and_plain_booleans_only(service: Service, query: str,
                                                                          param: str) -> None:
    with service.client() as client:
        r = client.post(f"/compress?{query}", content=b"x", headers={"content-type": "text/plain"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
