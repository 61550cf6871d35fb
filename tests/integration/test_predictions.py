"""Predicted outputs through the OpenAI SDK: same text as without, usage fields, validation."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.integration.conftest import MODEL, REPO, Service

PROMPT = "import os\n\ndef "


def _greedy(client: openai.OpenAI, max_tokens: int = 60, **kwargs: object) -> openai.types.Completion:
    return client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=max_tokens, temperature=0,
                                     **kwargs)  # type: ignore[arg-type]


def test_exact_prediction_is_accepted_and_changes_no_text(openai_client) -> None:
    plain = _greedy(openai_client)
    text = plain.choices[0].text
    predicted = _greedy(openai_client, extra_body={"prediction": {"type": "content", "content": text}})
    assert predicted.choices[0].text == text
    details = predicted.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 0.6 * predicted.usage.completion_tokens
    assert details.accepted_prediction_tokens + details.rejected_prediction_tokens <= \
        len(text) + predicted.usage.completion_tokens
    assert details.accepted_prediction_tokens <= predicted.usage.completion_tokens


def test_edited_prediction_reanchors_and_keeps_text(openai_client) -> None:
    text = _greedy(openai_client, max_tokens=80).choices[0].text
    lines = text.split("\n")
    edited = "\n".join([lines[0], "    # an inserted line that the model will not write", *lines[1:]])
    smart = _greedy(openai_client, max_tokens=80,
                    extra_body={"prediction": {"type": "content", "content": edited}})
    prefix = _greedy(openai_client, max_tokens=80,
                     extra_body={"prediction": {"type": "content", "content": edited}, "prediction_mode": "prefix"})
    assert smart.choices[0].text == text == prefix.choices[0].text
    assert (smart.usage.completion_tokens_details.accepted_prediction_tokens
            > prefix.usage.completion_tokens_details.accepted_prediction_tokens)


def _token_ids(service: Service, max_tokens: int) -> list[int]:
    """The greedy output's own token ids (k-CBS with one beam is greedy decoding)."""
    with service.client() as client:
        r = client.post("/v1/kcbs", json={"model": MODEL, "prompt": PROMPT, "beam_width": 1, "steps": max_tokens})
    return list(r.json()["sequences"][0]["token_ids"])


def test_prediction_tokenised_unlike_the_output_is_followed_on_its_text(service: Service, openai_client) -> None:
    """The prompt's greedy output writes ``utf8_survival`` with other token boundaries than the
    tokenizer gives its text: the prediction is followed on text, so even prefix mode (no
    re-anchoring) keeps being accepted past the first differing token."""
    text = _greedy(openai_client, max_tokens=120).choices[0].text
    with service.client() as client:
        encoded = client.post("/v1/tokenize", json={"model": MODEL, "prompt": text}).json()["tokens"]
    output_ids = _token_ids(service, 120)
    first_difference = next(i for i, (a, b) in enumerate(zip(encoded, output_ids, strict=False)) if a != b)
    assert first_difference < 40
    prefix = _greedy(openai_client, max_tokens=120, extra_body={
        "prediction": {"type": "content", "content": text}, "prediction_mode": "prefix"})
    assert prefix.choices[0].text == text
    assert prefix.usage.completion_tokens_details.accepted_prediction_tokens >= 0.75 * prefix.usage.completion_tokens


def test_token_id_prediction_with_other_boundaries_keeps_being_accepted(service: Service, openai_client) -> None:
    """The same text as the output, sent as token ids that split every 5th token in two."""
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(REPO / "models" / "pycoder-23m"))
    text = _greedy(openai_client, max_tokens=120).choices[0].text
    output_ids = _token_ids(service, 120)
    resplit: list[int] = []
    for i, token in enumerate(output_ids):
        piece = tokenizer.decode([token])
        if i % 5 == 4 and len(piece) >= 2:
            resplit += tokenizer.encode(piece[:1], add_special_tokens=False)
            resplit += tokenizer.encode(piece[1:], add_special_tokens=False)
        else:
            resplit.append(token)
    assert tokenizer.decode(resplit) == text and resplit != output_ids
    predicted = _greedy(openai_client, max_tokens=120,
                        extra_body={"prediction": {"type": "content", "token_ids": resplit}})
    assert predicted.choices[0].text == text
    details = predicted.usage.completion_tokens_details
    assert details.accepted_prediction_tokens >= 0.8 * predicted.usage.completion_tokens


def test_accepted_prediction_tokens_stay_within_the_completion(openai_client) -> None:
    """Drafts running past ``max_tokens`` would be verified, counted and then cut off."""
    text = _greedy(openai_client, max_tokens=120).choices[0].text
    for max_tokens in (50, 61):
        predicted = _greedy(openai_client, max_tokens=max_tokens,
                            extra_body={"prediction": {"type": "content", "content": text}})
        assert text.startswith(predicted.choices[0].text)
        details = predicted.usage.completion_tokens_details
        assert details.accepted_prediction_tokens <= predicted.usage.completion_tokens - 1
        assert details.accepted_prediction_tokens >= 0.6 * predicted.usage.completion_tokens


def test_chat_sdk_prediction_argument_works_unchanged(openai_client) -> None:
    messages = [{"role": "user", "content": "write a loop"}]
    plain = openai_client.chat.completions.create(model=MODEL, messages=messages, max_tokens=30, temperature=0)
    content = plain.choices[0].message.content
    predicted = openai_client.chat.completions.create(model=MODEL, messages=messages, max_tokens=30,
                                                      temperature=0,
                                                      prediction={"type": "content", "content": content})
    assert predicted.choices[0].message.content == content
    assert predicted.usage.completion_tokens_details.accepted_prediction_tokens > 0


def test_streaming_with_prediction_reports_usage(openai_client) -> None:
    text = _greedy(openai_client, max_tokens=40).choices[0].text
    chunks = list(openai_client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"prediction": {"type": "content", "content": text}}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert chunks[-1].usage.completion_tokens_details.accepted_prediction_tokens > 0


def test_seeded_sampling_with_useless_prediction_is_unchanged(openai_client) -> None:
    kwargs = {"model": MODEL, "prompt": PROMPT, "max_tokens": 30, "temperature": 0.7, "seed": 7}
    plain = openai_client.completions.create(**kwargs)
    predicted = openai_client.completions.create(**kwargs, extra_body={
        "prediction": {"type": "content", "content": "zzz qqq unrelated"}})
    assert predicted.choices[0].text == plain.choices[0].text


def test_token_id_predictions_are_accepted(service: Service, openai_client) -> None:
    with service.client() as client:
        first = client.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": 20,
                                                      "temperature": 0, "logprobs": 0}).json()
    text = first["choices"][0]["text"]
    plain = _greedy(openai_client, max_tokens=20)
    assert plain.choices[0].text == text
    with service.client() as client:
        tokens = client.post("/v1/kcbs", json={"model": MODEL, "prompt": PROMPT, "beam_width": 1,
                                               "steps": 20}).json()["sequences"][0]["token_ids"]
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": 20, "temperature": 0,
                                                 "prediction": {"type": "content", "token_ids": tokens}})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == text
    assert r.json()["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 10


@pytest.mark.parametrize(
    ("prediction", "extra"),
    [({"type": "image", "content": "x"}, {}),
     ({"type": "content", "content": 5}, {}), ({"type": "content", "content": "x" * 300_000}, {}),
     ({"type": "content", "content": "x"}, {"n": 2}), ({"type": "content", "content": "x"}, {"logprobs": 1}),
     ({"type": "content", "content": "x", "token_ids": [1]}, {}),
     ({"type": "content", "token_ids": [99999]}, {})],
)
def test_bad_predictions_are_400(service: Service, prediction: dict, extra: dict) -> None:
    with service.client() as client:
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": 4,
                                                 "prediction": prediction, **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"]


@pytest.mark.parametrize("content", ["", [], [{"type": "text", "text": ""}]])
def test_an_empty_prediction_is_served_as_no_prediction(openai_client, content: object) -> None:
    """A client predicting a file that is still empty gets the answer, with nothing drafted."""
    plain = _greedy(openai_client, max_tokens=12)
    empty = {"prediction": {"type": "content", "content": content}}
    predicted = _greedy(openai_client, max_tokens=12, extra_body=empty)
    assert predicted.choices[0].text == plain.choices[0].text
    details = predicted.usage.completion_tokens_details
    assert (details.accepted_prediction_tokens, details.rejected_prediction_tokens) == (0, 0)


def test_answers_are_kept_per_user_as_a_draft_source_and_change_no_text(service: Service, openai_client) -> None:
    """The prediction engine keeps finished answers (``prediction_response_cache_tokens``) and drafts
    a repeat of the same ``user``'s request from them; the text stays the greedy answer."""
    from tests.integration.conftest import live_state

    def kept() -> int:
        return int(live_state(service)["engines"]["predict"]["prediction_response_tokens"])

    plain = _greedy(openai_client, max_tokens=40).choices[0].text
    useless = {"prediction": {"type": "content", "content": "SELECT name FROM users;\n"}}
    before = kept()
    first = _greedy(openai_client, max_tokens=40, user="response-cache-test", extra_body=useless)
    assert first.choices[0].text == plain
    assert kept() > before
    again = _greedy(openai_client, max_tokens=40, user="response-cache-test", extra_body=useless)
    assert again.choices[0].text == plain
    assert again.usage.completion_tokens_details.accepted_prediction_tokens == 0


def test_the_prediction_engine_drafts_new_code_from_this_environments_sources(service: Service,
                                                                               openai_client) -> None:
    """The code datastore (``prediction_datastore_mib``) is built or loaded for the served tokenizer inside
    the real engine, and a request it drafts for keeps the greedy answer."""
    from tests.integration.conftest import live_state

    assert int(live_state(service)["engines"]["predict"]["prediction_datastore_ngrams"]) > 100_000
    plain = _greedy(openai_client, max_tokens=40).choices[0].text
    useless = {"prediction": {"type": "content", "content": "SELECT name FROM users;\n"}}
    assert _greedy(openai_client, max_tokens=40, extra_body=useless).choices[0].text == plain


def test_a_prediction_near_the_end_of_the_context_is_drafted_not_padded(service: Service, openai_client) -> None:
    """Within K tokens of ``max_model_len`` vLLM skips a drafter and schedules K drafts of token 0 for
    every row (each rejected, each step verifying K positions); the text drafter drafts there, so the
    prediction is accepted and nothing past the answer is counted as rejected. Twice: the second
    request finds its prompt in the prefix cache, the case that fell to those zero drafts."""
    with service.client() as client:
        limit = client.get("/v1/models").json()["data"][0]["max_model_len"]

        def length(text: str) -> int:
            return len(client.post("/v1/tokenize", json={"model": MODEL, "prompt": text}).json()["tokens"])

        lines = [f"def f{i}(x):\n    return x * {i}" for i in range(200)]
        count = next(n for n in range(200, 0, -1) if length("\n".join(lines[:n])) <= limit - 100)
        prompt = "\n".join(lines[:count])
        assert length(prompt) > limit - 130  # within K = 64 of the end once the answer is under way
    plain = openai_client.completions.create(model=MODEL, prompt=prompt, max_tokens=60, temperature=0)
    text = plain.choices[0].text
    for _ in range(2):
        predicted = openai_client.completions.create(model=MODEL, prompt=prompt, max_tokens=60, temperature=0,
                                                     extra_body={"prediction": {"type": "content", "content": text}})
        assert predicted.choices[0].text == text
        details = predicted.usage.completion_tokens_details
        assert details.accepted_prediction_tokens > 0.6 * predicted.usage.completion_tokens, details
        assert details.rejected_prediction_tokens < 64, details  # less than one step of zero drafts


def test_prediction_engine_requests_do_not_leak(service: Service) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 500, "ignore_eos": True, "stream": True,
            "prediction": {"type": "content", "content": "def f():\n    return 1\n" * 20}}
    with httpx.Client(base_url=service.base_url, headers=service.headers, timeout=60) as client, \
            client.stream("POST", "/v1/completions", json=body) as response:
        next(response.iter_lines())
    from tests.integration.conftest import wait_until_idle

    assert wait_until_idle(service) == 0
