"""What an OpenAI client library expects of the surface, through the official SDK where it has a call."""

from __future__ import annotations

import json
from typing import Literal

import openai
import pytest
from pydantic import BaseModel

from tests.integration.conftest import MODEL, Service

USER = [{"role": "user", "content": "def add(a, b):"}]


def test_models_retrieve_returns_the_served_model(openai_client) -> None:
    model = openai_client.models.retrieve(MODEL)
    assert (model.id, model.object) == (MODEL, "model")


def test_models_retrieve_of_an_unknown_id_is_openais_404(openai_client) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        openai_client.models.retrieve("gpt-17")
    assert caught.value.body["code"] == "model_not_found"


def test_completion_top_logprobs_include_the_sampled_token(openai_client) -> None:
    out = openai_client.completions.create(model=MODEL, prompt="import os\n", max_tokens=24, temperature=2.0,
                                           seed=7, logprobs=1)
    logprobs = out.choices[0].logprobs
    assert len(logprobs.tokens) == 24
    for token, logprob, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert top[token] == logprob
        assert 1 <= len(top) <= 2
    assert any(len(top) == 2 for top in logprobs.top_logprobs), "temperature 2 never sampled outside the top 1"


def test_completion_logprobs_zero_gives_the_sampled_tokens_entry(openai_client) -> None:
    out = openai_client.completions.create(model=MODEL, prompt="import os\n", max_tokens=6, temperature=0,
                                           logprobs=0)
    logprobs = out.choices[0].logprobs
    assert logprobs.top_logprobs == [{t: lp} for t, lp in zip(logprobs.tokens, logprobs.token_logprobs, strict=True)]


def test_usage_reports_prompt_tokens_served_from_the_prefix_cache(openai_client) -> None:
    prompt = "".join(f"def function_{i}(value):\n    return value * {i}\n\n" for i in range(40))
    first = openai_client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0)
    again = openai_client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0)
    assert first.usage.prompt_tokens_details is not None
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < again.usage.prompt_tokens


class Verdict(BaseModel):
    passed: bool
    grade: Literal["A", "B", "C"]


def test_json_schema_response_format_parses_with_the_sdk_helper(openai_client) -> None:
    parse = getattr(openai_client.chat.completions, "parse", None) or openai_client.beta.chat.completions.parse
    out = parse(model=MODEL, messages=[{"role": "user", "content": "Grade this: def f(): pass"}],
                response_format=Verdict, max_tokens=64, temperature=0)
    assert out.choices[0].message.content.startswith('{"passed":')
    parsed = out.choices[0].message.parsed
    assert isinstance(parsed, Verdict)
    assert Verdict.model_validate_json(out.choices[0].message.content) == parsed


def test_json_object_response_format_returns_a_json_object(openai_client) -> None:
    out = openai_client.chat.completions.create(model=MODEL, messages=USER, max_tokens=96, temperature=0,
                                                response_format={"type": "json_object"})
    assert out.choices[0].finish_reason == "stop", out.choices[0].message.content
    assert isinstance(json.loads(out.choices[0].message.content), dict)


def test_invalid_json_schema_is_400(service: Service) -> None:
    body = {"model": MODEL, "messages": USER, "max_tokens": 4, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}, "strict": True}}}
    for stream in (False, True):
        with service.client() as client:
            r = client.post("/v1/chat/completions", json={**body, "stream": stream})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["type"] == "invalid_request_error"


def test_optional_openai_fields_that_do_not_change_the_result_are_accepted(openai_client) -> None:
    plain = openai_client.chat.completions.create(model=MODEL, messages=USER, max_tokens=8, temperature=0)
    out = openai_client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=8, temperature=0, store=False, metadata={"team": "a"},
        service_tier="auto", user="u-1", prompt_cache_key="k", safety_identifier="s-1",
        parallel_tool_calls=False, modalities=["text"])
    assert out.choices[0].message.content == plain.choices[0].message.content


@pytest.mark.parametrize(("field", "value"), [("reasoning_effort", "low"), ("verbosity", "high"),
                                              ("modalities", ["text", "audio"])])
def test_fields_that_would_change_the_result_are_400_naming_them(openai_client, field: str, value: object) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.chat.completions.create(model=MODEL, messages=USER, max_tokens=4, **{field: value})
    assert field in str(caught.value.body["param"])


def test_message_name_is_refused_when_the_chat_template_ignores_it(openai_client) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi", "name": "alice"}], max_tokens=4)
    assert caught.value.body["param"] == "messages.0.name"


def test_continuous_usage_stats_puts_running_usage_on_every_chunk(openai_client) -> None:
    chunks = list(openai_client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    content_chunks = [c for c in chunks if c.choices]
    assert all(c.usage is not None for c in content_chunks)
    counts = [c.usage.completion_tokens for c in content_chunks]
    assert counts == sorted(counts) and counts[-1] == 6
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6


def test_tool_choice_none_with_tools_is_accepted(openai_client) -> None:
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
    out = openai_client.chat.completions.create(model=MODEL, messages=USER, max_tokens=4, tools=[tool],
                                                tool_choice="none")
    assert out.choices[0].message.tool_calls is None
    with pytest.raises(openai.BadRequestError):
        openai_client.chat.completions.create(model=MODEL, messages=USER, max_tokens=4, tools=[tool])


def test_image_parts_are_refused_as_unsupported_images(openai_client) -> None:
    content = [{"type": "text", "text": "what is this?"},
               {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}],
                                              max_tokens=4)
    assert "image" in caught.value.body["message"] and "not supported" in caught.value.body["message"]
    assert caught.value.body["param"] == "messages.0.content"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_logprobs_name_part_character_tokens_by_their_bytes_and_offsets_count_characters(openai_client,
                                                                                         stream: bool) -> None:
    kwargs = dict(model=MODEL, prompt="# 日本語のコメント: 関数", max_tokens=6, temperature=0, logprobs=2)
    if stream:
        chunks = [c for c in openai_client.completions.create(stream=True, **kwargs) if c.choices]
        text = "".join(c.choices[0].text for c in chunks)
        tokens = [t for c in chunks for t in c.choices[0].logprobs.tokens]
        tops = [t for c in chunks for t in c.choices[0].logprobs.top_logprobs]
        offsets = [o for c in chunks for o in c.choices[0].logprobs.text_offset]
    else:
        out = openai_client.completions.create(**kwargs)
        text, logprobs = out.choices[0].text, out.choices[0].logprobs
        tokens, tops, offsets = logprobs.tokens, logprobs.top_logprobs, logprobs.text_offset
    assert any(t.startswith("bytes:") for t in tokens), tokens
    assert all(token in top and len(top) >= 2 for token, top in zip(tokens, tops, strict=True)), tops
    assert offsets == sorted(offsets) and offsets[-1] < len(text), (offsets, text)
    assert offsets == _offsets_of_bytes(tokens), (tokens, offsets)
    chat = openai_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "日本語"}],
                                                 max_tokens=8, temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert b"".join(bytes(entry.bytes) for entry in content).decode() == chat.choices[0].message.content


def _offsets_of_bytes(tokens: list[str]) -> list[int]:
    """Each token's offset as the echo path counts it: the characters its predecessors' bytes decode to
    (a character split over tokens counts at the token completing it)."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    offsets, at = [], 0
    for token in tokens:
        data = (bytes(int(h, 16) for h in token[len("bytes:"):].split("\\x")[1:]) if token.startswith("bytes:")
                else token.encode())
        offsets.append(at)
        at += len(decoder.decode(data))
    return offsets
