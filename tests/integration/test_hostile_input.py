"""Hostile but valid-JSON input is a cheap, honest 4xx that goes through the gateway like any reply
(request id, metrics), never a 500 and never a false "engine failed" 503."""

from __future__ import annotations

import json
from typing import Any

import pytest

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
