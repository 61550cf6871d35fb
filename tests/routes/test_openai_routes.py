"""HTTP behaviour of the OpenAI routes over the fake engine adapter: shapes, streaming, errors,
disconnects. What the engine computes is tested on real engines in ``tests/integration``."""

from __future__ import annotations

import math
import threading
from typing import Any

import httpx
import openai
import pytest
from cascade.engine.types import EngineFailedError, EngineRequestError
from cascade_common.sse import SSEParser

from tests.routes.conftest import FakeService
from tests.routes.fake_engine import REPLY

MODEL = "pycoder-23m"


def _events(response: httpx.Response) -> list[Any]:
    """Each event's JSON data; ``[DONE]`` as that string."""
    parser = SSEParser()
    events = [e for chunk in response.iter_bytes() for e in parser.feed(chunk)]
    return ["[DONE]" if e.done else e.data for e in events]


def _sdk(service: FakeService) -> openai.OpenAI:
    return openai.OpenAI(base_url=service.base_url + "/v1", api_key="route-tier-key", max_retries=0)


def test_completion_has_openai_shape_usage_and_cached_tokens(service: FakeService) -> None:
    reply = _sdk(service).completions.create(model=MODEL, prompt="def f(value):\n", max_tokens=6)
    assert reply.object == "text_completion" and reply.id.startswith("cmpl-")
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].text == service.engines.tokenizer.decode(service.engines.tokenizer.encode(REPLY)[:6])
    assert reply.usage is not None and reply.usage.completion_tokens == 6
    assert reply.usage.prompt_tokens_details is not None and reply.usage.prompt_tokens_details.cached_tokens > 0


def test_streamed_chat_announces_the_role_once_and_ends_with_usage_and_done(service: FakeService) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True}}
    with service.client() as client, client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        data = _events(response)
    assert data[-1] == "[DONE]"
    chunks = data[:-1]
    roles = [c["choices"][0]["delta"].get("role") for c in chunks if c["choices"]]
    assert roles[0] == "assistant" and roles[1:] == [None] * (len(roles) - 1)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_every_chunk_of_a_stream_carries_the_requests_id_and_created(service: FakeService, route: str) -> None:
    service.engines.delay = 0.3  # five outputs: the stream spans at least one second boundary
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if "chat" in route else {"prompt": "x"})
    with service.client() as client, client.stream("POST", route, json=body) as response:
        chunks = _events(response)[:-1]
    assert len(chunks) == 6
    assert len({c["created"] for c in chunks}) == 1 and len({c["id"] for c in chunks}) == 1


def test_completion_logprobs_hold_the_sampled_token_and_chat_holds_the_top_n(service: FakeService) -> None:
    completion = _sdk(service).completions.create(model=MODEL, prompt="x", max_tokens=3, logprobs=0)
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None and logprobs.top_logprobs is not None and logprobs.tokens is not None
    assert all(len(top) == 1 and token in top for top, token in zip(logprobs.top_logprobs, logprobs.tokens,
                                                                   strict=True))
    assert logprobs.text_offset == [0, *[sum(len(t) for t in logprobs.tokens[:i + 1]) for i in range(2)]]
    chat = _sdk(service).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                                 max_tokens=2, logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and all(len(entry.top_logprobs) == 3 for entry in content)
    assert all(math.isclose(entry.logprob, math.log(0.5)) for entry in content)


def test_engine_refusal_is_a_400_before_any_stream_starts(service: FakeService) -> None:
    service.engines.refuse = EngineRequestError("Invalid request: bad_words entries must tokenize", "bad_words",
                                                "invalid_value")
    for stream in (False, True):
        with service.client() as client:
            r = client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 3,
                                                     "stream": stream})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "bad_words" and r.json()["error"]["code"] == "invalid_value"


def test_adapter_validation_is_a_400_with_the_parameter(service: FakeService) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        _sdk(service).completions.create(model=MODEL, prompt="x", max_tokens=3, temperature=6)
    assert caught.value.body["param"] == "temperature"  # type: ignore[index]


def test_engine_death_mid_stream_is_one_error_event_with_its_status_then_done(service: FakeService) -> None:
    service.engines.fail_after = (2, EngineFailedError("engine died"))
    body = {"model": MODEL, "prompt": "x", "max_tokens": 8, "stream": True}
    with service.client() as client, client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        data = _events(response)
    assert data[-1] == "[DONE]"
    error = data[-2]["error"]
    assert error["status"] == 503 and error["code"] == "engine_unavailable"
    assert len(data) == 4  # two deltas, the error, [DONE]


def test_unexpected_failure_mid_stream_is_a_500_event_without_internals(service: FakeService) -> None:
    service.engines.fail_after = (1, RuntimeError("secret internal detail"))
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 5, "stream": True}
    with service.client() as client, client.stream("POST", "/v1/chat/completions", json=body) as response:
        data = _events(response)
    error = data[-2]["error"]
    assert error["status"] == 500 and "secret" not in error["message"]


def test_dropped_stream_aborts_the_engine_request(service: FakeService) -> None:
    engines = service.engines
    engines.delay = 0.02
    body = {"model": MODEL, "prompt": "x", "max_tokens": 1000, "stream": True}
    with service.client() as client, client.stream("POST", "/v1/completions", json=body) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
    done = threading.Event()
    for _ in range(500):
        if engines.aborted == 1 and engines.running == 0:
            done.set()
            break
        done.wait(0.01)
    assert done.is_set(), (engines.aborted, engines.running)
    with service.client() as client:
        state = client.get("/ops/live-state").json()
    assert state["gateway"]["engine_aborts"] == 1


def test_prediction_usage_is_reported(service: FakeService) -> None:
    reply = _sdk(service).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4,
        prediction={"type": "content", "content": REPLY})
    details = reply.usage.completion_tokens_details  # type: ignore[union-attr]
    assert details is not None and details.accepted_prediction_tokens == 4
    _, request = service.engines.requests[-1]
    assert request.prediction is not None and list(request.prediction.token_ids) == \
        service.engines.tokenizer.encode(REPLY)


def test_metrics_are_labelled_by_the_matched_route(service: FakeService) -> None:
    with service.client() as client:
        assert client.get(f"/v1/models/{MODEL}").status_code == 200
        assert client.post("/v1/tokenize", json={"model": MODEL, "prompt": "x"}).status_code == 200
        assert client.get("/no/such/path").status_code == 404
        metrics = client.get("/metrics").text
    assert 'route="/v1/models/{model:path}",status="200"' in metrics
    assert 'route="/v1/tokenize",status="200"' in metrics
    assert 'route="other",status="404"' in metrics


@pytest.mark.parametrize("path", ["/health", "/ready", "/metrics", "/v1/models", f"/v1/models/{MODEL}"])
def test_a_head_probe_gets_the_status_and_headers_of_the_get(service: FakeService, path: str) -> None:
    with service.client() as client:
        head, get = client.head(path), client.get(path)
    assert head.status_code == get.status_code == 200
    assert head.content == b"" and head.headers["content-type"] == get.headers["content-type"]
    assert head.headers["x-request-id"]


def test_ready_names_the_codec_state(service: FakeService) -> None:
    with service.client() as client:
        ready = client.get("/ready")
    assert ready.status_code == 200 and "disabled" in ready.json()["codec"]


def test_codec_routes_say_why_the_codec_is_off(service: FakeService) -> None:
    with service.client() as client:
        r = client.post("/compress", json={"text": "hello"})
    assert r.status_code == 503 and "disabled" in r.json()["error"]["message"]


def test_kcbs_runs_on_the_adapter_and_bounds_probability(service: FakeService) -> None:
    body = {"model": MODEL, "prompt": "def f():\n", "beam_width": 3, "steps": 4}
    with service.client() as client:
        r = client.post("/v1/kcbs", json=body)
        state = client.get("/ops/live-state").json()
    assert r.status_code == 200, r.text
    result = r.json()
    assert 0 < result["captured_probability"] <= 1 and len(result["sequences"]) == 3
    assert state["gateway"]["kcbs_searches"] == 0


def test_export_renders_every_position(service: FakeService) -> None:
    prompt = service.engines.tokenizer.encode("def f(x):\n    return x\n")
    with service.client() as client:
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "compression": True,
                                                 "compression_top_k": 4})
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert [p["token_id"] for p in content] == prompt[1:]
    export = service.engines.requests[-1][1]
    assert export.export_top_k == 4 and export.max_tokens == 1
