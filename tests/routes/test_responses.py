"""OpenAI's Responses API through the SDK (``client.responses``), against the fake engine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.routes.conftest import API_KEY, FakeService
from tests.routes.fake_engine import REPLY

MODEL = "pycoder-23m"


@pytest.fixture
def client(service: FakeService) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{service.base_url}/v1", api_key=API_KEY, max_retries=0) as sdk:
        yield sdk


def _prompt_text(service: FakeService) -> str:
    return service.engines.tokenizer.decode(service.engines.requests[-1][0])


def test_a_response_holds_one_message_with_the_text_and_usage(client: openai.OpenAI, service: FakeService) -> None:
    response = client.responses.create(model=MODEL, input="Say hi", max_output_tokens=6)
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.output_text == service.engines.tokenizer.decode(service.engines.tokenizer.encode(REPLY)[:6])
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 6 and response.usage.input_tokens == len(service.engines.requests[-1][0])
    assert response.output[0].role == "assistant" and response.output[0].content[0].type == "output_text"


def test_instructions_come_first_and_a_previous_response_is_continued(client: openai.OpenAI,
                                                                     service: FakeService) -> None:
    first = client.responses.create(model=MODEL, input="first question", instructions="Be brief.",
                                    max_output_tokens=3)
    assert _prompt_text(service).startswith("system: Be brief.\nuser: first question\n")
    client.responses.create(model=MODEL, input="second question", previous_response_id=first.id,
                            max_output_tokens=3)
    prompt = _prompt_text(service)
    assert "Be brief." not in prompt  # instructions are not carried over
    assert f"user: first question\nassistant: {first.output_text}\nuser: second question\n" in prompt


def test_output_items_sent_back_as_input_continue_the_conversation(client: openai.OpenAI,
                                                                   service: FakeService) -> None:
    first = client.responses.create(model=MODEL, input="q1", max_output_tokens=3, store=False)
    history: list[Any] = [{"role": "user", "content": "q1"}, *[item.model_dump() for item in first.output],
                          {"role": "user", "content": [{"type": "input_text", "text": "q2"}]}]
    client.responses.create(model=MODEL, input=history, max_output_tokens=3)
    assert f"assistant: {first.output_text}\nuser: q2\n" in _prompt_text(service)
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL, input="q", previous_response_id=first.id)
    assert info.value.body["param"] == "previous_response_id"  # type: ignore[index]


def test_a_streamed_response_sends_openais_events_in_order(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model=MODEL, input="hi", max_output_tokens=5, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text and events[-1].response.usage.output_tokens == 5


def test_a_stored_response_is_retrieved_and_deleted(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="hi", max_output_tokens=2)
    assert client.responses.retrieve(response.id).output_text == response.output_text
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


def test_a_json_schema_text_format_constrains_the_output(client: openai.OpenAI, service: FakeService) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    client.responses.create(model=MODEL, input="x", max_output_tokens=4,
                            text={"format": {"type": "json_schema", "name": "A", "schema": schema, "strict": True}})
    constraint = service.engines.requests[-1][1].constraint
    assert constraint is not None and constraint.grammar and constraint.source == "response_format"


def test_logprobs_come_with_the_text_when_included(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="x", max_output_tokens=3, top_logprobs=2,
                                       include=["message.output_text.logprobs"])
    logprobs = response.output[0].content[0].logprobs
    assert len(logprobs) == 3 and all(len(entry.top_logprobs) == 2 for entry in logprobs)


@pytest.mark.parametrize(("extra", "param"), [
    ({"tools": [{"type": "web_search"}]}, "tools"), ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"background": True}, "background"), ({"include": ["reasoning.encrypted_content"]}, "include"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "1"}]}, "input.0.type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input.0.content"),
    ({"max_output_tokens": 10**6}, "max_output_tokens"),
])
def test_what_this_model_cannot_do_is_a_400_naming_the_field(client: openai.OpenAI, extra: dict[str, Any],
                                                             param: str) -> None:
    body = {"model": MODEL, "input": "x", **extra}
    with pytest.raises(openai.BadRequestError) as info:
        client.post("/responses", body=body, cast_to=dict)
    assert info.value.body["param"].startswith(param), info.value.body  # type: ignore[index]


def test_a_stream_that_fails_after_its_200_ends_with_a_numbered_error_event(service: FakeService) -> None:
    service.engines.fail_after = (2, RuntimeError("boom"))
    with service.client() as client:
        r = client.post("/v1/responses", json={"model": MODEL, "input": "x", "max_output_tokens": 6, "stream": True})
    events = [line for line in r.text.splitlines() if line.startswith(("event:", "data:"))]
    assert events[-2] == "event: error"
    last = json.loads(events[-1][5:])
    numbers = [json.loads(line[5:])["sequence_number"] for line in events if line.startswith("data:")]
    assert last["type"] == "error" and last["code"] == "internal_error" and numbers == list(range(len(numbers)))


def test_the_sdks_stream_helper_accumulates_the_events(client: openai.OpenAI) -> None:
    """The helper checks that every event fits the snapshot it builds. A response cut by
    ``max_output_tokens`` ends ``response.incomplete``, as OpenAI's does (the helper's final response needs
    ``response.completed``, which the fake engine, always cut by length, never gives)."""
    with client.responses.stream(model=MODEL, input="hi", max_output_tokens=4) as stream:
        events = list(stream)
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.output_text == "".join(deltas) and events[-1].response.usage.output_tokens == 4


@pytest.mark.parametrize("stream", [False, True])
def test_errors_of_the_chat_completion_underneath_name_the_responses_fields(service: FakeService,
                                                                            stream: bool) -> None:
    fmt = {"type": "json_schema", "name": "a", "schema": {"type": "nonsense"}}
    with service.client() as client:
        r = client.post("/v1/responses", json={"model": MODEL, "input": "x", "stream": stream,
                                               "text": {"format": fmt}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "text.format.schema", r.text
    assert "response_format" not in r.json()["error"]["message"]


def test_a_message_error_names_its_input_item_past_the_instructions_and_history(client: openai.OpenAI) -> None:
    first = client.responses.create(model=MODEL, input="q", max_output_tokens=2)
    items = [{"role": "user", "content": "ok"}, {"role": "tool", "content": "x"}]
    with pytest.raises(openai.BadRequestError) as info:
        client.post("/responses", body={"model": MODEL, "input": items, "instructions": "i",
                                        "previous_response_id": first.id}, cast_to=dict)
    assert info.value.body["param"].startswith("input.1"), info.value.body  # type: ignore[index]


@pytest.mark.parametrize(("content", "param"), [
    ([{"type": "input_text", "text": "hi"}, {"type": "input_image", "image_url": "data:x"}], "input.0.content.1.type"),
    ([{"type": "input_text", "text": 5}], "input.0.content.0.text"),
    ([{"type": "input_text"}], "input.0.content.0"),
    ([], "input.0.content"),
])
def test_a_content_part_that_is_not_text_is_named_by_its_place(client: openai.OpenAI, content: list[Any],
                                                               param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.post("/responses", body={"model": MODEL, "input": [{"role": "user", "content": content}]},
                    cast_to=dict)
    assert info.value.body["param"].startswith(param), info.value.body  # type: ignore[index]


@pytest.mark.parametrize("extra", [{"metadata": {f"k{i}": "v" for i in range(17)}}, {"metadata": {"k": "v" * 513}},
                                   {"text": {"format": {"type": "json_schema", "name": "a b", "schema": {}}}}])
def test_openais_bounds_on_metadata_and_schema_names_hold(client: openai.OpenAI, extra: dict[str, Any]) -> None:
    with pytest.raises(openai.BadRequestError):
        client.post("/responses", body={"model": MODEL, "input": "x", **extra}, cast_to=dict)


def test_chat_field_names_read_as_the_responses_fields() -> None:
    from cascade.api.responses_routes import _Names

    names = _Names(instructions=True, offset=3)
    assert [names.param(p) for p in ("messages.0", "messages.2.content", "messages.4.content", "messages",
                                     "response_format.json_schema.schema", "max_completion_tokens", "temperature",
                                     None)] == [
        "instructions", "previous_response_id", "input.1.content", "input", "text.format.schema",
        "max_output_tokens", "temperature", None]
    assert names.message("response_format.json_schema.schema is bad") == "text.format.schema is bad"


@pytest.mark.parametrize("stream", [False, True])
def test_a_responses_output_tokens_are_counted_streamed_or_not(client: openai.OpenAI, service: FakeService,
                                                               stream: bool) -> None:
    counter = service.gateway.metrics.completion_tokens.labels("responses")
    before = counter._value.get()
    out = client.responses.create(model=MODEL, input="x", max_output_tokens=3, stream=stream)
    if stream:
        list(out)  # type: ignore[arg-type]
    assert counter._value.get() - before == 3
