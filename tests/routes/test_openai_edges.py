"""OpenAI edges a peer conformance suite exercises: replayed tool calls, and 400s that name the
exact field holding a lone surrogate."""

from __future__ import annotations

import json

import openai
import pytest

from tests.routes.conftest import FakeService

MODEL = "pycoder-23m"
REPLAY: list[dict[str, object]] = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"},
    {"role": "user", "content": "And tomorrow?"},
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def _sdk(service: FakeService) -> openai.OpenAI:
    return openai.OpenAI(base_url=service.base_url + "/v1", api_key="route-tier-key", max_retries=0)


@pytest.mark.parametrize("tools", [{}, {"tools": TOOLS, "tool_choice": "none"}], ids=["no tools", "tools off"])
def test_a_replayed_tool_call_is_rendered_into_the_prompt(service: FakeService, tools: dict[str, object]) -> None:
    reply = _sdk(service).chat.completions.create(model=MODEL, messages=REPLAY, max_tokens=3, **tools)  # type: ignore[arg-type]
    assert reply.choices[0].message.content
    prompt_ids, _ = service.engines.requests[-1]
    prompt = service.engines.tokenizer.decode(prompt_ids)
    call = json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})
    assert f"assistant: {call}\ntool: 18 C and sunny\nuser: And tomorrow?\n" in prompt


def test_tool_call_arguments_nested_past_the_json_parsers_depth_stay_text(service: FakeService) -> None:
    deep = "[" * 1100
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": deep}}
    messages = [{"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "user", "content": "go"}]
    reply = _sdk(service).chat.completions.create(model=MODEL, messages=messages, max_tokens=3)  # type: ignore[arg-type]
    assert reply.choices[0].message.content
    prompt_ids, _ = service.engines.requests[-1]
    assert deep[:50] in service.engines.tokenizer.decode(prompt_ids)


def test_a_tool_call_on_a_user_message_is_a_400_naming_it(service: FakeService) -> None:
    messages = [{**REPLAY[1], "role": "user"}]
    with pytest.raises(openai.BadRequestError) as caught:
        _sdk(service).chat.completions.create(model=MODEL, messages=messages, max_tokens=3)  # type: ignore[arg-type]
    assert caught.value.body["param"] == "messages.0.tool_calls"  # type: ignore[index]


def test_tools_that_could_be_called_are_still_refused(service: FakeService) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        _sdk(service).chat.completions.create(model=MODEL, messages=REPLAY, tools=TOOLS, max_tokens=3)  # type: ignore[arg-type]
    assert caught.value.body["param"] == "tools"  # type: ignore[index]


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi \ud800"}]}, "messages.0.content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "\udc00"}]}]},
     "messages.0.content.0.text"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stop": ["a", "\ud800"]}, "stop.1"),
    ("/v1/completions", {"prompt": ["fine", "bad \ud800"]}, "prompt.1"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"\ud800": 1}}, "logit_bias"),
])
def test_a_lone_surrogate_is_a_400_naming_the_exact_field(service: FakeService, path: str, body: dict[str, object],
                                                         param: str) -> None:
    raw = json.dumps({"model": MODEL, **body}).encode()  # ASCII-escaped: valid JSON holding "\ud800"
    with service.client() as client:
        r = client.post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == param and f"'{param}'" in error["message"] and "surrogate" in error["message"]


def test_chat_without_a_chat_template_is_a_400_naming_it_and_completions_still_work(
        service: FakeService, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service.engines.tokenizer, "chat_template", None)
    with pytest.raises(openai.BadRequestError) as caught:
        _sdk(service).chat.completions.create(model=MODEL, messages=REPLAY[:1], max_tokens=3)  # type: ignore[arg-type]
    assert caught.value.code == "no_chat_template" and "no chat template" in caught.value.message
    assert _sdk(service).completions.create(model=MODEL, prompt="def f():", max_tokens=3).choices[0].text


@pytest.mark.parametrize(("field", "value"), [("suffix", "\n# end"), ("best_of", 3)])
def test_completion_options_this_service_does_not_implement_are_400s_naming_them(
        service: FakeService, field: str, value: object) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        _sdk(service).completions.create(model=MODEL, prompt="def f():", max_tokens=3, **{field: value})  # type: ignore[call-overload]
    assert caught.value.body["param"] == field and "not supported" in caught.value.message  # type: ignore[index]


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", {"prompt": 5}, "prompt"),
    ("/v1/completions", {"prompt": "x", "stop": 5}, "stop"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
     "messages.0.content.0.text"),
])
def test_a_wrong_type_in_a_union_field_is_a_400_naming_the_field_not_the_union_member(
        service: FakeService, path: str, body: dict[str, object], param: str) -> None:
    with service.client() as client:
        r = client.post(path, json={"model": MODEL, **body})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == param


@pytest.mark.parametrize(("path", "field", "value"), [
    ("/v1/completions", "max_tokens", "5"),
    ("/v1/completions", "max_tokens", True),
    ("/v1/completions", "max_tokens", 100.0),
    ("/v1/completions", "compression", "yes"),
    ("/v1/completions", "seed", 1.5),
    ("/v1/chat/completions", "n", "2"),
    ("/v1/chat/completions", "stream", 1),
    ("/v1/chat/completions", "temperature", "0.5"),
])
def test_a_value_of_the_wrong_json_type_is_a_400_not_coerced(service: FakeService, path: str, field: str,
                                                             value: object) -> None:
    body = {"prompt": "x"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "x"}]}
    with service.client() as client:
        r = client.post(path, json={"model": MODEL, "max_tokens": 2, **body, field: value})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field and error["code"], error


def test_an_integer_reads_as_a_number_where_a_float_is_expected(service: FakeService) -> None:
    with service.client() as client:
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2, "temperature": 1,
                                                 "top_p": 1, "logit_bias": {"5": 1}})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", {"prompt": "x = 1\n" * 600, "max_tokens": 1}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x = 1\n" * 600}], "max_tokens": 1}, "messages"),
    ("/v1/completions", {"prompt": "x = 1\n" * 100, "max_tokens": 1000}, "max_tokens"),
])
def test_a_context_overflow_names_the_prompt_when_it_alone_fills_the_window(
        service: FakeService, path: str, body: dict[str, object], param: str) -> None:
    with service.client() as client:
        r = client.post(path, json={"model": MODEL, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", param), error


def test_a_kcbs_context_overflow_by_messages_names_messages(service: FakeService) -> None:
    with service.client() as client:
        r = client.post("/v1/kcbs", json={"model": MODEL, "messages": [{"role": "user", "content": "x = 1\n" * 600}],
                                          "beam_width": 2, "steps": 2})
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["code"], r.json()["error"]["param"]) == ("context_length_exceeded", "messages")


def test_kcbs_steps_past_the_context_are_a_context_overflow_naming_steps(service: FakeService) -> None:
    with service.client() as client:
        prompt = "x = 1\n" * 220
        tokens = client.post("/v1/tokenize", json={"model": MODEL, "prompt": prompt}).json()["tokens"]
        room = service.gateway.settings.max_model_len - len(tokens)
        assert 0 < room < service.gateway.settings.max_kcbs_steps
        r = client.post("/v1/kcbs", json={"model": MODEL, "prompt": prompt, "beam_width": 2, "steps": 900})
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["code"], r.json()["error"]["param"]) == ("context_length_exceeded", "steps")
    assert f"at most {room} " in r.json()["error"]["message"]


def test_kcbs_steps_past_the_service_limit_name_that_limit_whatever_the_room(service: FakeService) -> None:
    limit = service.gateway.settings.max_kcbs_steps
    with service.client() as client:
        r = client.post("/v1/kcbs", json={"model": MODEL, "prompt": "x = 1\n", "beam_width": 1, "steps": limit + 500})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "steps" and f"at most {limit} (max_kcbs_steps)" in error["message"], error


@pytest.mark.parametrize("key", ["٣", " 5", "+5", "1_0", "5.0"])
def test_logit_bias_keys_are_token_ids_in_ascii_digits(service: FakeService, key: str) -> None:
    with service.client() as client:
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1,
                                                 "logit_bias": {key: 1}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias", r.text


@pytest.mark.parametrize("role", ["user", "system", "tool"])
def test_a_message_without_content_is_a_400_unless_it_is_the_assistants(service: FakeService, role: str) -> None:
    message: dict[str, object] = {"role": role, "content": None}
    if role == "tool":
        message["tool_call_id"] = "call_1"
    with service.client() as client:
        r = client.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 2, "messages": [message]})
        allowed = client.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 2, "messages": [
            {"role": "user", "content": "x"}, {"role": "assistant", "content": None},
            {"role": "user", "content": "y"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.0.content", r.text
    assert allowed.status_code == 200, allowed.text


@pytest.mark.parametrize(("extra", "param"), [({"logit_bias": {"5": 1}}, "logit_bias"),
                                              ({"min_p": 0.1, "temperature": 1.0}, "min_p")])
def test_sampling_options_speculative_decoding_cannot_apply_are_refused_beside_a_prediction_by_name(
        service: FakeService, extra: dict[str, object], param: str) -> None:
    with service.client() as client:
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2, **extra,
                                                 "prediction": {"type": "content", "content": "x = 1"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_chat_top_logprobs_over_the_limit_names_top_logprobs(service: FakeService) -> None:
    with service.client() as client:
        body = {"model": MODEL, "max_tokens": 2, "logprobs": True, "top_logprobs": 21,
                "messages": [{"role": "user", "content": "x"}]}
        r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs", r.text


def test_a_json_body_sent_as_a_form_is_told_to_send_json(service: FakeService) -> None:
    with service.client() as client:
        r = client.post("/v1/completions", content=b'{"model": "pycoder-23m", "prompt": "x"}',
                        headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 400 and "content-type: application/json" in r.json()["error"]["message"], r.text


def test_an_unusable_json_schema_is_a_400_without_the_grammar_compilers_source_location(service: FakeService) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}
    with service.client() as client:
        r = client.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 2, "response_format": fmt,
                                                      "messages": [{"role": "user", "content": "x"}]})
    message = r.json()["error"]["message"]
    assert r.status_code == 400 and "nonsense" in message and ".cc:" not in message, message


@pytest.mark.parametrize(("path", "field"), [
    ("/v1/completions", "n"), ("/v1/completions", "echo"), ("/v1/completions", "stream"),
    ("/v1/chat/completions", "n"), ("/v1/chat/completions", "logprobs"), ("/v1/chat/completions", "stream"),
    ("/v1/chat/completions", "prediction_mode"),
])
def test_null_for_an_optional_parameter_means_its_default(service: FakeService, path: str, field: str) -> None:
    body = {"prompt": "x"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "x"}]}
    with service.client() as client:
        r = client.post(path, json={"model": MODEL, "max_tokens": 2, **body, field: None})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 1


def test_a_null_completion_max_tokens_is_openais_default_of_16(service: FakeService) -> None:
    with service.client() as client:
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": None})
        model_null = client.post("/v1/completions", json={"model": None, "prompt": "x"})
    assert r.status_code == 200, r.text
    assert service.engines.requests[-1][1].max_tokens == 16
    assert model_null.status_code == 400 and model_null.json()["error"]["param"] == "model"


def test_an_unknown_service_tier_is_a_400_naming_it(service: FakeService) -> None:
    messages = [{"role": "user", "content": "x"}]
    with service.client() as client:
        bad = client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 2,
                                                        "service_tier": "bogus"})
        good = client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 2,
                                                         "service_tier": "auto"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "service_tier"
    assert good.status_code == 200


def test_a_trailing_slash_is_an_unknown_route_not_a_redirect(service: FakeService) -> None:
    with service.client() as client:
        r = client.post("/v1/chat/completions/", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 404
    assert r.json()["error"]["message"] == "Unknown route"


def test_an_empty_body_is_a_400_saying_it_is_empty(service: FakeService) -> None:
    with service.client() as client:
        r = client.post("/v1/completions", content=b"", headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert "body is empty" in r.json()["error"]["message"]


@pytest.mark.parametrize("body", [b'{"model": "x",', b"\xff\xfe{", b"[" * 100_000 + b"]" * 100_000],
                         ids=["cut short", "not UTF-8", "nested too deeply"])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/compress"])
def test_a_body_that_is_not_json_is_invalid_json_on_every_route(service: FakeService, path: str, body: bytes) -> None:
    with service.client() as client:
        r = client.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "invalid_json" and error["param"] is None
    assert error["message"].startswith("Request body is not valid JSON")


def test_a_developer_message_reaches_a_template_without_that_role_as_the_system_instruction(
        service: FakeService) -> None:
    messages = [{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "hi"}]
    reply = _sdk(service).chat.completions.create(model=MODEL, messages=messages, max_tokens=2)  # type: ignore[arg-type]
    assert reply.choices[0].message.content is not None
    prompt = service.engines.tokenizer.decode(service.engines.requests[-1][0])
    assert "system: Answer in French.\nuser: hi\n" in prompt and "developer" not in prompt


def test_a_compressed_request_body_is_a_415_not_a_parse_error(service: FakeService) -> None:
    import gzip

    body = gzip.compress(json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 2}).encode())
    with service.client() as client:
        r = client.post("/v1/completions", content=body,
                        headers={"content-type": "application/json", "content-encoding": "gzip"})
        plain = client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2},
                            headers={"content-encoding": "identity"})
        bodiless = client.get("/v1/models", headers={"content-encoding": "gzip"})
    assert r.status_code == 415 and bodiless.status_code == 200
    assert r.json()["error"]["code"] == "unsupported_content_encoding"
    assert plain.status_code == 200


def test_echo_puts_the_prompt_before_each_completion_streamed_or_not(service: FakeService) -> None:
    sdk = _sdk(service)
    whole = sdk.completions.create(model=MODEL, prompt=["def f():", "x = 1"], max_tokens=3, echo=True)
    assert whole.choices[0].text.startswith("def f():") and whole.choices[1].text.startswith("x = 1")
    plain = sdk.completions.create(model=MODEL, prompt="def f():", max_tokens=3)
    streamed = "".join(c.choices[0].text for c in sdk.completions.create(model=MODEL, prompt="def f():",
                                                                       max_tokens=3, echo=True, stream=True))
    assert streamed == whole.choices[0].text == "def f():" + plain.choices[0].text
    ids = service.engines.tokenizer.encode("def f():")
    by_ids = sdk.completions.create(model=MODEL, prompt=ids, max_tokens=3, echo=True)
    assert by_ids.choices[0].text == service.engines.tokenizer.decode(ids) + plain.choices[0].text


def test_echo_with_logprobs_scores_the_prompt_as_openais_legacy_completions_do(service: FakeService) -> None:
    """What lm-evaluation-harness reads for a log-likelihood: one list over prompt and completion, the
    first prompt token without a logprob."""
    ids = service.engines.tokenizer.encode("def f():")
    sdk = _sdk(service)
    whole = sdk.completions.create(model=MODEL, prompt=ids, max_tokens=2, echo=True, logprobs=1, temperature=0)
    logprobs = whole.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None and logprobs.token_logprobs is not None
    assert len(logprobs.tokens) == len(ids) + 2
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs is not None
    assert logprobs.top_logprobs[0] is None
    assert all(lp is not None and lp <= 0 for lp in logprobs.token_logprobs[1:])
    assert logprobs.text_offset is not None and logprobs.text_offset[0] == 0
    assert "".join(logprobs.tokens) == whole.choices[0].text
    chunks = list(sdk.completions.create(model=MODEL, prompt=ids, max_tokens=2, echo=True, logprobs=1,
                                         temperature=0, stream=True))
    streamed = [t for c in chunks for t in (c.choices[0].logprobs.tokens or [])]  # type: ignore[union-attr]
    offsets = [o for c in chunks for o in (c.choices[0].logprobs.text_offset or [])]  # type: ignore[union-attr]
    assert streamed == logprobs.tokens and offsets == logprobs.text_offset


@pytest.mark.parametrize("extra", [{"codec": {"mode": "encode"}}, {"compression": True}])
def test_echo_beside_the_codec_or_the_export_is_a_400_naming_echo(service: FakeService, extra: dict[str, object]
                                                                   ) -> None:
    with service.client() as client:
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "echo": True, **extra})
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo", r.text


def test_echo_with_max_tokens_0_scores_the_prompt_and_samples_nothing_visible(service: FakeService) -> None:
    ids = service.engines.tokenizer.encode("def f():")
    sdk = _sdk(service)
    scored = sdk.completions.create(model=MODEL, prompt=ids, max_tokens=0, echo=True, logprobs=1)
    choice = scored.choices[0]
    assert choice.text == service.engines.tokenizer.decode(ids) and choice.finish_reason == "length"
    assert choice.logprobs is not None and len(choice.logprobs.tokens or []) == len(ids)
    assert scored.usage is not None and scored.usage.completion_tokens == 0
    chunks = list(sdk.completions.create(model=MODEL, prompt=ids, max_tokens=0, echo=True, logprobs=1, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.completions.create(model=MODEL, prompt=ids, max_tokens=0)
    assert refused.value.body["param"] == "max_tokens"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as too_many:
        sdk.completions.create(model=MODEL, prompt=ids, max_tokens=0, echo=True, extra_body={"min_tokens": 5})
    assert "max_tokens (0)" in too_many.value.message


@pytest.mark.parametrize("prefix", ["/v1", ""], ids=["v1", "vllm's root paths"])
def test_detokenize_gives_back_the_text_tokenize_cut(service: FakeService, prefix: str) -> None:
    text = "def f(x):\n    return x  # é 😀\n"
    with service.client() as client:
        ids = client.post(f"{prefix}/tokenize", json={"model": MODEL, "prompt": text}).json()["tokens"]
        back = client.post(f"{prefix}/detokenize", json={"model": MODEL, "tokens": ids})
        assert back.status_code == 200 and back.json() == {"prompt": text}
        outside = client.post(f"{prefix}/detokenize", json={"model": MODEL, "tokens": [1, 10**9]})
        assert outside.status_code == 400 and outside.json()["error"]["param"] == "tokens"
        unknown = client.post(f"{prefix}/detokenize", json={"model": "gpt-4o", "tokens": ids})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
        unauthorized = client.post(f"{prefix}/detokenize", json={"model": MODEL, "tokens": ids},
                                   headers={"authorization": "Bearer wrong"})
        assert unauthorized.status_code == 401


def test_an_sdk_reply_sent_back_with_model_dump_continues_the_conversation(service: FakeService) -> None:
    """``message.model_dump()`` holds ``annotations``, ``audio``, ``function_call`` and ``refusal`` as null
    (or ``[]``): OpenAI takes such a message back, so this service does too."""
    sdk = _sdk(service)
    first = [{"role": "user", "content": "hi"}]
    reply = sdk.chat.completions.create(model=MODEL, messages=first, max_tokens=3)  # type: ignore[arg-type]
    dumped = reply.choices[0].message.model_dump()
    assert {"annotations", "audio", "function_call"} <= dumped.keys()
    for cited in (None, []):
        again = sdk.chat.completions.create(model=MODEL, max_tokens=3, messages=[  # type: ignore[arg-type]
            *first, {**dumped, "annotations": cited}, {"role": "user", "content": "again"}])
        assert again.choices[0].message.content
        prompt = service.engines.tokenizer.decode(service.engines.requests[-1][0])
        assert f"assistant: {dumped['content']}\nuser: again\n" in prompt


@pytest.mark.parametrize(("field", "value"), [("audio", {"id": "audio_1"}),
                                              ("function_call", {"name": "f", "arguments": "{}"})])
def test_an_audio_reply_or_a_deprecated_function_call_is_a_400_naming_it(
        service: FakeService, field: str, value: dict[str, str]) -> None:
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", field: value},
                {"role": "user", "content": "z"}]
    with pytest.raises(openai.BadRequestError) as caught:
        _sdk(service).chat.completions.create(model=MODEL, messages=messages, max_tokens=3)  # type: ignore[arg-type]
    assert caught.value.body["param"] == f"messages.1.{field}"  # type: ignore[index]


def test_an_assistant_refusal_part_is_read_as_what_the_assistant_said(service: FakeService) -> None:
    messages = [{"role": "user", "content": "x"},
                {"role": "assistant", "content": [{"type": "refusal", "refusal": "I cannot help with that."}]},
                {"role": "user", "content": "z"}]
    _sdk(service).chat.completions.create(model=MODEL, messages=messages, max_tokens=3)  # type: ignore[arg-type]
    prompt = service.engines.tokenizer.decode(service.engines.requests[-1][0])
    assert "assistant: I cannot help with that.\nuser: z\n" in prompt
    user_refusal = [{"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}]
    with pytest.raises(openai.BadRequestError) as caught:
        _sdk(service).chat.completions.create(model=MODEL, messages=user_refusal, max_tokens=3)  # type: ignore[arg-type]
    assert caught.value.body["param"] == "messages.0.content"  # type: ignore[index]


def test_a_tool_message_without_its_tool_call_id_is_a_400_naming_it(service: FakeService) -> None:
    messages = [*REPLAY[:2], {"role": "tool", "content": "18 C"}]
    with pytest.raises(openai.BadRequestError) as caught:
        _sdk(service).chat.completions.create(model=MODEL, messages=messages, max_tokens=3)  # type: ignore[arg-type]
    assert caught.value.body["param"] == "messages.2.tool_call_id"  # type: ignore[index]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_stream_options_include_obfuscation_is_accepted_and_streams_the_same(service: FakeService, path: str) -> None:
    body: dict[str, object] = {"model": MODEL, "max_tokens": 3, "stream": True, "temperature": 0}
    body.update({"messages": [{"role": "user", "content": "x"}]} if "chat" in path else {"prompt": "x"})
    with service.client() as client:
        texts = [client.post(path, json={**body, "stream_options": options}).text
                 for options in ({"include_usage": True}, {"include_usage": True, "include_obfuscation": False})]
    assert all(t.rstrip().endswith("data: [DONE]") for t in texts)
    plain, with_option = (len(t.split("data: ")) for t in texts)
    assert plain == with_option


def test_an_unknown_model_is_a_404_typed_as_openai_types_it(service: FakeService) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        _sdk(service).chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}], max_tokens=3)
    assert caught.value.body == {**caught.value.body, "type": "invalid_request_error", "code": "model_not_found"}  # type: ignore[dict-item]


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_number_is_a_400_saying_so(service: FakeService, value: str) -> None:
    with service.client() as client:
        r = client.post("/v1/completions", content=f'{{"model": "{MODEL}", "prompt": "x", "temperature": {value}}}',
                        headers={"content-type": "application/json"})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "temperature" and "finite" in error["message"], r.text


def test_models_with_a_trailing_slash_is_the_list(service: FakeService) -> None:
    with service.client() as client:
        listed, slashed = client.get("/v1/models").json(), client.get("/v1/models/").json()
    assert slashed == listed and slashed["data"][0]["id"] == MODEL


def test_version_names_this_service_and_the_vllm_it_wraps(service: FakeService) -> None:
    with service.client() as client:
        r = client.get("/version")
    assert r.status_code == 200 and r.json()["version"] and r.json()["vllm_version"].startswith("0."), r.text
