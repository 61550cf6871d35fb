"""Requests vLLM refuses are the client's fault: a 400 in OpenAI's shape, before any 200 goes out,
on every route that hands parameters to vLLM, and the keep-alive connection stays usable."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import pytest
from openai import OpenAI

from tests.integration.conftest import MODEL, Service

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "def f():"}], "max_tokens": 4}
COMPLETION = {"model": MODEL, "prompt": "def f():", "max_tokens": 4}
REFUSED_BY_VLLM = [
    pytest.param({"n": 2, "temperature": 0}, "n", id="n>1-greedy"),
    pytest.param({"min_tokens": 8, "max_tokens": 4}, "min_tokens", id="min_tokens>max_tokens"),
    pytest.param({"bad_words": [""]}, "bad_words", id="empty-bad-word"),
    pytest.param({"seed": 2**64}, "seed", id="seed-over-64-bits"),
    pytest.param({"seed": -(2**63) - 1}, "seed", id="seed-under-64-bits"),
    pytest.param({"stop_token_ids": [10**9]}, "stop_token_ids", id="stop-token-id-outside-the-vocabulary"),
    pytest.param({"stop_token_ids": list(range(65))}, "stop_token_ids", id="more-stop-token-ids-than-the-limit"),
]


def _error(status: int, body: bytes) -> dict:
    assert status == 400, body
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    return error


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path,base", [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)])
@pytest.mark.parametrize(("extra", "param"), REFUSED_BY_VLLM)
def test_parameters_vllm_refuses_are_400_naming_the_param(service: Service, path: str, base: dict, stream: bool,
                                                           extra: dict, param: str) -> None:
    with service.client() as client:
        r = client.post(path, json={**base, **extra, "stream": stream})
    assert r.headers["content-type"].startswith("application/json")
    assert _error(r.status_code, r.content)["param"] == param
    assert "Retry-After" not in r.headers


@pytest.mark.parametrize("extra", [{"bad_words": [""]}, {"seed": 2**64}])
def test_export_parameters_vllm_refuses_are_400(service: Service, extra: dict) -> None:
    body = {"model": MODEL, "prompt": "def f():\n    return 1\n", "compression": True, "compression_top_k": 4, **extra}
    with service.client() as client:
        r = client.post("/v1/completions", json=body)
    _error(r.status_code, r.content)


def test_seed_at_the_edges_of_64_bits_is_served(service: Service) -> None:
    with service.client() as client:
        for seed in (2**64 - 1, -(2**63)):
            r = client.post("/v1/completions", json={**COMPLETION, "seed": seed, "temperature": 1.0})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["finish_reason"] in ("length", "stop")


def test_connection_stays_open_after_a_vllm_validation_error(service: Service) -> None:
    url = urlsplit(service.base_url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=120)
    headers = {**service.headers, "Content-Type": "application/json"}
    try:
        conn.request("POST", "/v1/completions", json.dumps({**COMPLETION, "n": 2, "temperature": 0}), headers)
        bad = conn.getresponse()
        _error(bad.status, bad.read())
        assert bad.getheader("connection", "").lower() != "close"
        sock = conn.sock
        conn.request("POST", "/v1/completions", json.dumps(COMPLETION), headers)
        good = conn.getresponse()
        assert good.status == 200
        assert json.loads(good.read())["choices"][0]["text"] is not None
        assert conn.sock is sock, "the server closed the keep-alive connection after the 400"
    finally:
        conn.close()


def test_stop_token_ids_end_generation_at_that_token_through_the_sdk(service: Service, openai_client: OpenAI) -> None:
    """vLLM's ``stop_token_ids`` (``extra_body`` in the SDK): the text ends before the first such
    token, ``finish_reason`` is ``stop`` and usage counts the stopping token, as vLLM's server does."""
    with service.client() as client:
        x, y = (client.post("/v1/tokenize", json={"model": MODEL, "prompt": c}).json()["tokens"] for c in "xy")
    assert len(x) == len(y) == 1
    ids = {"x": x[0], "y": y[0]}
    sdk = openai_client
    base = {"model": MODEL, "max_tokens": 12, "temperature": 0}
    extra = {"allowed_token_ids": list(ids.values()), "ignore_eos": True}
    free = sdk.completions.create(prompt="def f():", **base, extra_body=extra).choices[0].text
    assert len(free) == 12 and set(free) <= {"x", "y"}, free
    last = free[-1]
    cut = free.index(last)  # the text ends before the first token that is a stop token
    out = sdk.completions.create(prompt="def f():", **base, extra_body={**extra, "stop_token_ids": [ids[last]]})
    assert (out.choices[0].text, out.choices[0].finish_reason) == (free[:cut], "stop")
    assert out.usage is not None and out.usage.completion_tokens == cut + 1
    chat = sdk.chat.completions.create(messages=[{"role": "user", "content": "hi"}], **base,
                                       extra_body={**extra, "stop_token_ids": list(ids.values())})
    assert (chat.choices[0].message.content, chat.choices[0].finish_reason) == ("", "stop")
