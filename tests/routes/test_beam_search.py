"""vLLM's ``use_beam_search`` through HTTP (the fake engine's next-token table: after token t, t+1 is
the likeliest, then t+2, …, each half as likely as the one before)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.routes.conftest import FakeService

MODEL = "pycoder-23m"
CHAT = [{"role": "user", "content": "x"}]


def _post(service: FakeService, path: str, body: dict[str, Any]) -> Any:
    with service.client() as client:
        return client.post(path, json={"model": MODEL, "use_beam_search": True, **body})


def test_beam_search_answers_n_greedy_choices_per_prompt_as_vllms_suite_asks(service: FakeService) -> None:
    r = _post(service, "/v1/completions", {"prompt": ["Hello, my name is"] * 2, "n": 2, "max_tokens": 5,
                                           "temperature": 0.0})
    assert r.status_code == 200, r.text
    texts = [c["text"] for c in r.json()["choices"]]
    assert [c["index"] for c in r.json()["choices"]] == [0, 1, 2, 3]
    assert texts[0] != texts[1] and texts[0] == texts[2] and texts[1] == texts[3]
    assert r.json()["usage"]["completion_tokens"] == 4 * 5
    assert {c["finish_reason"] for c in r.json()["choices"]} == {"length"}


def test_the_best_beam_is_the_likeliest_sequence(service: FakeService) -> None:
    prompt = service.engines.tokenizer.encode("Hello")
    r = _post(service, "/v1/completions", {"prompt": prompt, "n": 3, "max_tokens": 3, "return_token_ids": True})
    assert r.status_code == 200, r.text
    first = r.json()["choices"][0]
    start = prompt[-1]
    assert first["token_ids"] == [start + 1, start + 2, start + 3]
    assert first["prompt_token_ids"] == prompt


def test_chat_beam_search_gives_n_messages(service: FakeService) -> None:
    r = _post(service, "/v1/chat/completions", {"messages": CHAT, "n": 3, "max_tokens": 4})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert len({c["message"]["content"] for c in choices}) == 3
    assert all(c["message"]["role"] == "assistant" for c in choices)


def test_beam_search_logprobs_are_each_steps_row(service: FakeService) -> None:
    r = _post(service, "/v1/completions", {"prompt": "Hello", "n": 2, "max_tokens": 3, "logprobs": 3})
    assert r.status_code == 200, r.text
    logprobs = r.json()["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == 3
    assert all(len(top) in (3, 4) for top in logprobs["top_logprobs"])
    assert logprobs["token_logprobs"][0] == pytest.approx(-0.6931, abs=1e-3)


def test_echo_puts_the_prompt_before_every_beam(service: FakeService) -> None:
    r = _post(service, "/v1/completions", {"prompt": "Hello", "n": 2, "max_tokens": 2, "echo": True})
    assert r.status_code == 200, r.text
    assert all(c["text"].startswith("Hello") for c in r.json()["choices"])


@pytest.mark.parametrize(("extra", "param"), [
    ({"stream": True}, "stream"), ({"stop": ["x"]}, "stop"), ({"logit_bias": {"5": 1.0}}, "logit_bias"),
    ({"prediction": {"type": "content", "content": "abc"}}, "prediction"),
    ({"structured_outputs": {"regex": "a+"}}, "structured_outputs"), ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"n": 9}, "n"), ({"max_tokens": 300}, "max_tokens"), ({"echo": True, "logprobs": 1}, "logprobs"),
    ({"logprobs": 21}, "logprobs"), ({"prompt_logprobs": 0}, "prompt_logprobs"),
    ({"length_penalty": 400}, "length_penalty"), ({"length_penalty": -11}, "length_penalty"),
    ({"repetition_penalty": 1.2}, "repetition_penalty"),
])
def test_what_a_beam_search_cannot_honour_is_a_400_naming_it(service: FakeService, extra: dict[str, Any],
                                                            param: str) -> None:
    r = _post(service, "/v1/completions", {"prompt": "x", "n": 2, "max_tokens": 3, **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_length_penalty_without_beam_search_is_a_400(service: FakeService) -> None:
    with service.client() as client:
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "length_penalty": 2.0})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "length_penalty"


def test_chat_beam_search_without_max_tokens_runs_within_the_search_limits(service: FakeService) -> None:
    r = _post(service, "/v1/chat/completions", {"messages": CHAT, "n": 2})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 2 * service.gateway.settings.max_kcbs_steps


def test_neutral_sampling_values_pass_with_beam_search(service: FakeService) -> None:
    r = _post(service, "/v1/completions", {"prompt": "x", "n": 2, "max_tokens": 2, "presence_penalty": 0.0,
                                           "frequency_penalty": 0, "repetition_penalty": 1.0, "logit_bias": {},
                                           "stop": [], "min_tokens": 0, "repetition_detection": {}})
    assert r.status_code == 200, r.text


def test_chat_beam_search_top_logprobs_are_bounded_too(service: FakeService) -> None:
    r = _post(service, "/v1/chat/completions", {"messages": CHAT, "n": 2, "max_tokens": 2, "logprobs": True,
                                                "top_logprobs": 21})
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs", r.text
