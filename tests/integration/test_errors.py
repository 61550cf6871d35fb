"""Bad requests get OpenAI-shaped errors with the right status, and the service keeps serving."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.integration.conftest import MODEL, Service


def _assert_error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if param is not None:
        assert error["param"] == param
    return error


def _post(service: Service, path: str, **kwargs: object) -> httpx.Response:
    with service.client() as client:
        return client.post(path, **kwargs)  # type: ignore[arg-type]


def test_malformed_json_is_400(service: Service) -> None:
    r = _post(service, "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    error = _assert_error(r, 400)
    assert "JSON" in error["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL, "messages": "hello"}, "messages"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": 3.5}, "temperature"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_p": 0}, "top_p"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}, "max_tokens"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 0}, "n"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 99}, "n"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 100000}, "max_tokens"),
        ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        ({"model": MODEL, "messages": []}, "messages"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "bogus": 1}, "bogus"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "logit_bias": {"99999": 1}}, "logit_bias"),
    ],
)
def test_invalid_chat_parameters_are_400_naming_the_param(service: Service, body: dict, param: str) -> None:
    _assert_error(_post(service, "/v1/chat/completions", json=body), 400, param)


def test_prompt_longer_than_context_is_400(service: Service) -> None:
    r = _post(service, "/v1/completions", json={"model": MODEL, "prompt": "x = 1\n" * 2000, "max_tokens": 4})
    assert _assert_error(r, 400)["code"] == "context_length_exceeded"


def test_unknown_model_is_404(service: Service) -> None:
    r = _post(service, "/v1/completions", json={"model": "gpt-17", "prompt": "x", "max_tokens": 1})
    assert _assert_error(r, 404, "model")["code"] == "model_not_found"


def test_unknown_route_is_404(service: Service) -> None:
    with service.client() as client:
        _assert_error(client.get("/v1/nothing-here"), 404)


def test_missing_or_wrong_api_key_is_401(service: Service) -> None:
    body = {"model": MODEL, "prompt": "x", "max_tokens": 1}
    _assert_error(httpx.post(service.base_url + "/v1/completions", json=body), 401)
    _assert_error(httpx.post(service.base_url + "/v1/completions", json=body,
                             headers={"Authorization": "Bearer wrong"}), 401)
    assert httpx.get(service.base_url + "/health").status_code == 200  # liveness stays open


def test_openai_sdk_raises_typed_errors(service: Service) -> None:
    client = openai.OpenAI(base_url=service.base_url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    good = openai.OpenAI(base_url=service.base_url + "/v1", api_key=service.api_key, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        good.completions.create(model="nope", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError):
        good.completions.create(model=MODEL, prompt="x", max_tokens=1, temperature=9)


def test_oversized_body_is_413(service: Service) -> None:
    big = "x" * (17 * 1024 * 1024)
    r = _post(service, "/v1/completions", json={"model": MODEL, "prompt": big, "max_tokens": 1})
    _assert_error(r, 413)


def test_service_still_serves_after_bad_requests(openai_client) -> None:
    out = openai_client.completions.create(model=MODEL, prompt="import ", max_tokens=3, temperature=0)
    assert out.usage.completion_tokens == 3
