"""vLLM's request extensions a client of vLLM's server sends (``extra_body``): each reaches the engine as
vLLM would pass it, and a wrong use is a 400 naming the field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.routes.conftest import FakeService

MODEL = "pycoder-23m"
CHAT = [{"role": "user", "content": "x"}]


def _post(service: FakeService, path: str, body: dict[str, Any]) -> Any:
    with service.client() as client:
        return client.post(path, json={"model": MODEL, "max_tokens": 2, **body})


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize(("wanted", "expected"), [
    ({"choice": ["yes", "no"]}, {"choice": ("yes", "no")}),
    ({"regex": "[0-9]{3}"}, {"regex": "[0-9]{3}"}),
    ({"grammar": 'root ::= "a"'}, {"grammar": 'root ::= "a"'}),
])
def test_structured_outputs_reach_the_engine_as_one_constraint(service: FakeService, path: str,
                                                               wanted: dict[str, Any],
                                                               expected: dict[str, Any]) -> None:
    body = {"structured_outputs": wanted, **({"messages": CHAT} if "chat" in path else {"prompt": "x"})}
    r = _post(service, path, body)
    assert r.status_code == 200, r.text
    constraint = service.engines.requests[-1][1].constraint
    assert constraint is not None
    assert {k: v for k, v in vars(constraint).items() if v is not None} == {**expected, "source": "structured_outputs"}


@pytest.mark.parametrize("wanted", [{"json": {"type": "object", "properties": {"a": {"type": "integer"}}}},
                                    {"json": '{"type": "object"}'}, {"json_object": True}])
def test_structured_json_becomes_a_compact_json_grammar(service: FakeService, wanted: dict[str, Any]) -> None:
    r = _post(service, "/v1/completions", {"prompt": "x", "structured_outputs": wanted})
    assert r.status_code == 200, r.text
    constraint = service.engines.requests[-1][1].constraint
    assert constraint is not None and constraint.grammar and "root" in constraint.grammar


def test_response_format_is_taken_on_completions_too(service: FakeService) -> None:
    r = _post(service, "/v1/completions", {"prompt": "x", "response_format": {"type": "json_object"}})
    assert r.status_code == 200, r.text
    constraint = service.engines.requests[-1][1].constraint
    assert constraint is not None and constraint.grammar


@pytest.mark.parametrize(("wanted", "words"), [
    ({}, "exactly one"), ({"regex": "a", "choice": ["b"]}, "not regex and choice"),
    ({"json_object": False}, "must be true"), ({"choice": []}, "at least 1"), ({"whitespace_pattern": " "}, "Extra"),
])
def test_structured_outputs_other_than_one_constraint_are_a_400(service: FakeService, wanted: dict[str, Any],
                                                                 words: str) -> None:
    r = _post(service, "/v1/completions", {"prompt": "x", "structured_outputs": wanted})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"].startswith("structured_outputs"), r.text
    assert words in error["message"], error


def test_response_format_and_structured_outputs_together_are_a_400(service: FakeService) -> None:
    r = _post(service, "/v1/chat/completions", {"messages": CHAT, "response_format": {"type": "json_object"},
                                                "structured_outputs": {"regex": "a"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "structured_outputs", r.text


def test_an_unusable_structured_json_schema_names_structured_outputs_json(service: FakeService) -> None:
    r = _post(service, "/v1/completions", {"prompt": "x", "structured_outputs": {"json": {"type": "nonsense"}}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "structured_outputs.json", r.text


def test_special_token_rendering_options_reach_the_engine(service: FakeService) -> None:
    r = _post(service, "/v1/completions", {"prompt": "x", "skip_special_tokens": False,
                                           "spaces_between_special_tokens": False})
    assert r.status_code == 200, r.text
    request = service.engines.requests[-1][1]
    assert (request.skip_special_tokens, request.spaces_between_special_tokens) == (False, False)
    _post(service, "/v1/completions", {"prompt": "x"})
    request = service.engines.requests[-1][1]
    assert (request.skip_special_tokens, request.spaces_between_special_tokens) == (True, True)


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(service: FakeService) -> None:
    ids = list(range(10, 40))
    r = _post(service, "/v1/completions", {"prompt": ids, "truncate_prompt_tokens": 5})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 5, r.text
    assert service.engines.requests[-1][0] == ids[-5:]


def test_truncate_prompt_tokens_lets_a_prompt_longer_than_the_context_in(service: FakeService) -> None:
    settings = service.gateway.settings
    text = "word " * (settings.max_model_len * 2)
    r = _post(service, "/v1/completions", {"prompt": text, "truncate_prompt_tokens": 100})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 100, r.text
    untruncated = _post(service, "/v1/completions", {"prompt": text})
    assert untruncated.status_code == 400 and untruncated.json()["error"]["code"] == "context_length_exceeded"


def test_truncate_prompt_tokens_keeps_a_chats_last_tokens(service: FakeService) -> None:
    r = _post(service, "/v1/chat/completions", {"messages": CHAT, "truncate_prompt_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 2, r.text


def test_echo_of_a_truncated_prompt_shows_what_was_kept(service: FakeService) -> None:
    tokenizer = service.engines.tokenizer
    ids = tokenizer.encode("alpha beta gamma delta")
    r = _post(service, "/v1/completions", {"prompt": "alpha beta gamma delta", "truncate_prompt_tokens": 2,
                                           "echo": True})
    assert r.status_code == 200 and r.json()["choices"][0]["text"].startswith(tokenizer.decode(ids[-2:])), r.text


@pytest.mark.parametrize("keep", [0, 10**6, -2])
def test_truncate_prompt_tokens_outside_its_range_is_a_400(service: FakeService, keep: int) -> None:
    r = _post(service, "/v1/completions", {"prompt": "x", "truncate_prompt_tokens": keep})
    assert r.status_code == 400 and r.json()["error"]["param"] == "truncate_prompt_tokens", r.text


def test_chat_template_options_reach_the_template(service: FakeService) -> None:
    messages = [*CHAT, {"role": "assistant", "content": "def f("}]
    r = _post(service, "/v1/chat/completions", {"messages": messages, "add_generation_prompt": False,
                                                "continue_final_message": True,
                                                "chat_template_kwargs": {"enable_thinking": False}})
    assert r.status_code == 200, r.text
    assert service.engines.tokenizer.template_options == {  # type: ignore[attr-defined]
        "enable_thinking": False, "add_generation_prompt": False, "continue_final_message": True}


@pytest.mark.parametrize(("body", "param"), [
    ({"continue_final_message": True}, "continue_final_message"),
    ({"continue_final_message": True, "add_generation_prompt": False}, "continue_final_message"),
    ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs.tokenize"),
    ({"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs.add_generation_prompt"),
])
def test_chat_template_options_that_cannot_apply_are_a_400_naming_them(service: FakeService, body: dict[str, Any],
                                                                        param: str) -> None:
    r = _post(service, "/v1/chat/completions", {"messages": CHAT, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


@pytest.mark.parametrize("field", ["response_format", "structured_outputs"])
def test_a_compression_export_refuses_a_constraint_by_name(service: FakeService, field: str) -> None:
    value = {"type": "json_object"} if field == "response_format" else {"regex": "a"}
    r = _post(service, "/v1/completions", {"prompt": "x y", "compression": True, "max_tokens": 0, field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text


def test_return_token_ids_gives_the_prompts_and_each_choices_ids(service: FakeService) -> None:
    ids = [5, 6, 7, 8]
    body = _post(service, "/v1/completions", {"prompt": ids, "n": 2, "temperature": 1.0,
                                              "return_token_ids": True}).json()
    for choice in body["choices"]:
        assert choice["prompt_token_ids"] == ids
        assert len(choice["token_ids"]) == 2
        assert service.engines.tokenizer.decode(choice["token_ids"]) == choice["text"]
    plain = _post(service, "/v1/completions", {"prompt": ids}).json()
    assert plain["choices"][0]["token_ids"] is None and plain["choices"][0]["prompt_token_ids"] is None


def test_return_token_ids_on_chat_puts_the_prompt_ids_at_the_top(service: FakeService) -> None:
    body = _post(service, "/v1/chat/completions", {"messages": CHAT, "return_token_ids": True}).json()
    assert body["prompt_token_ids"] == service.engines.requests[-1][0]
    assert len(body["choices"][0]["token_ids"]) == 2


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_streamed_token_ids_join_to_the_choices_ids_and_the_prompt_comes_once(service: FakeService,
                                                                              path: str) -> None:
    body = {"max_tokens": 4, "stream": True, "return_token_ids": True,
            **({"messages": CHAT} if "chat" in path else {"prompt": [5, 6, 7]})}
    with service.client() as client, client.stream("POST", path, json={"model": MODEL, **body}) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    ids = [t for c in chunks for choice in c["choices"] for t in choice["token_ids"]]
    prompts = [c.get("prompt_token_ids") or choice.get("prompt_token_ids") for c in chunks for choice in c["choices"]]
    assert len(ids) == 4
    assert [p for p in prompts if p] == [service.engines.requests[-1][0]]


def test_prompt_logprobs_give_each_prompt_tokens_logprob_rank_and_alternatives(service: FakeService) -> None:
    ids = [5, 6, 7]
    body = _post(service, "/v1/completions", {"prompt": ids, "prompt_logprobs": 2}).json()
    scores = body["choices"][0]["prompt_logprobs"]
    assert scores[0] is None and len(scores) == len(ids)
    for token, position in zip(ids[1:], scores[1:], strict=True):
        assert str(token) in position and len(position) == 2
        assert {"logprob", "rank", "decoded_token"} == set(position[str(token)])
        assert sorted(entry["rank"] for entry in position.values()) == [1, 2]
    chat = _post(service, "/v1/chat/completions", {"messages": CHAT, "prompt_logprobs": 0}).json()
    assert chat["prompt_logprobs"][0] is None and all(len(p) == 1 for p in chat["prompt_logprobs"][1:])


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ({"prompt_logprobs": 10**6}, "prompt_logprobs"),
    ({"prompt_logprobs": -1}, "prompt_logprobs"),
    ({"prompt_logprobs": 1, "compression": True, "max_tokens": 0}, "prompt_logprobs"),
    ({"return_token_ids": True, "compression": True, "max_tokens": 0}, "return_token_ids"),
])
def test_prompt_extras_that_cannot_apply_are_a_400_naming_them(service: FakeService, body: dict[str, Any],
                                                               param: str) -> None:
    r = _post(service, "/v1/completions", {"prompt": "x y", **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


@pytest.fixture
def bos_tokenizer(service: FakeService) -> Iterator[int]:
    """The fake's tokenizer as a model's that adds a BOS to text (Llama's), for one test."""
    from tokenizers.processors import TemplateProcessing

    backend = service.engines.tokenizer._tok  # type: ignore[attr-defined]
    bos = backend.token_to_id("<s>")
    backend.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    try:
        yield bos
    finally:
        backend.post_processor = None


def test_a_text_prompt_gets_the_tokenizers_bos_as_in_vllm_unless_asked_not_to(service: FakeService,
                                                                               bos_tokenizer: int) -> None:
    _post(service, "/v1/completions", {"prompt": "x = 1"})
    assert service.engines.requests[-1][0][0] == bos_tokenizer
    _post(service, "/v1/completions", {"prompt": "x = 1", "add_special_tokens": False})
    assert service.engines.requests[-1][0][0] != bos_tokenizer
    _post(service, "/v1/completions", {"prompt": [7, 8, 9]})
    assert service.engines.requests[-1][0] == [7, 8, 9]
    _post(service, "/v1/chat/completions", {"messages": CHAT})
    assert service.engines.requests[-1][0][0] != bos_tokenizer
    _post(service, "/v1/chat/completions", {"messages": CHAT, "add_special_tokens": True})
    assert service.engines.requests[-1][0][0] == bos_tokenizer


@pytest.mark.parametrize("stream", [False, True])
def test_chat_echo_puts_the_last_assistant_message_before_the_reply(service: FakeService, stream: bool) -> None:
    messages = [*CHAT, {"role": "assistant", "content": "def f("}]
    body = {"model": MODEL, "max_tokens": 2, "messages": messages, "echo": True, "add_generation_prompt": False,
            "continue_final_message": True, "stream": stream}
    with service.client() as client:
        if stream:
            with client.stream("POST", "/v1/chat/completions", json=body) as r:
                chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
            content = "".join(c["choices"][0]["delta"]["content"] for c in chunks if c["choices"])
        else:
            content = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
        plain = client.post("/v1/chat/completions", json={**body, "echo": False, "stream": False}).json()
    assert content == "def f(" + plain["choices"][0]["message"]["content"]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_return_tokens_as_token_ids_names_every_logprob_token_by_its_id(service: FakeService, path: str) -> None:
    chat = "chat" in path
    body = {"return_tokens_as_token_ids": True, "return_token_ids": True,
            **({"messages": CHAT, "logprobs": True, "top_logprobs": 2} if chat else {"prompt": "x", "logprobs": 2})}
    reply = _post(service, path, body).json()
    choice = reply["choices"][0]
    if chat:
        names = [entry["token"] for entry in choice["logprobs"]["content"]]
        alternatives = [top["token"] for entry in choice["logprobs"]["content"] for top in entry["top_logprobs"]]
    else:
        names = choice["logprobs"]["tokens"]
        alternatives = [key for top in choice["logprobs"]["top_logprobs"] for key in top]
    assert names == [f"token_id:{t}" for t in choice["token_ids"]]
    assert alternatives and all(a.startswith("token_id:") for a in alternatives)


@pytest.mark.parametrize("field", ["structured_outputs", "response_format"])
def test_a_json_schema_nested_past_the_limit_is_a_400_before_any_compiling(service: FakeService, field: str) -> None:
    depth = service.gateway.settings.max_schema_depth
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    value = ({"json": schema} if field == "structured_outputs"
             else {"type": "json_schema", "json_schema": {"name": "deep", "schema": schema}})
    r = _post(service, "/v1/completions", {"prompt": "x", field: value})
    error = r.json()["error"]
    assert r.status_code == 400 and "max_schema_depth" in error["message"] and error["param"].startswith(field), r.text


def test_nesting_depth_counts_objects_and_arrays() -> None:
    from cascade.api.structured import nesting_depth

    assert nesting_depth("x") == 0 and nesting_depth({}) == 1 and nesting_depth({"a": [1, {"b": []}]}) == 4


@pytest.mark.parametrize(("value", "param"), [
    ({"structured_outputs": {"json": {"type": "object", "properties": {f"p{i}": {"type": "string"}
                                                                       for i in range(5000)}}}},
     "structured_outputs.json"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "wide", "schema": {
        "type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(2000)}}}}},
     "response_format.json_schema.schema"),
    ({"structured_outputs": {"regex": "a" * 200_000}}, "structured_outputs.regex"),
    ({"structured_outputs": {"grammar": 'root ::= "' + "a" * 200_000 + '"'}}, "structured_outputs.grammar"),
    ({"structured_outputs": {"choice": ["x" * 1000] * 200}}, "structured_outputs.choice"),
])
def test_a_constraint_too_large_for_the_engine_to_compile_is_a_400(service: FakeService, value: dict[str, Any],
                                                                    param: str) -> None:
    """A 50,000-property schema (1.5 MB) made the engine's grammar compiler take 20 GB and the kernel
    killed the engine: the size is bounded before anything compiles in the engine."""
    r = _post(service, "/v1/completions", {"prompt": "x", **value})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == param and "max_grammar_bytes" in error["message"], r.text
    assert not service.engines.requests


def test_a_chat_stream_of_several_choices_carries_the_prompt_ids_once(service: FakeService) -> None:
    body = {"model": MODEL, "max_tokens": 3, "stream": True, "n": 2, "temperature": 1.0, "return_token_ids": True,
            "messages": CHAT}
    with service.client() as client, client.stream("POST", "/v1/chat/completions", json=body) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert [c["prompt_token_ids"] for c in chunks if "prompt_token_ids" in c] == [service.engines.requests[-1][0]]
    assert sorted(len([t for c in chunks for ch in c["choices"] if ch["index"] == i for t in ch["token_ids"]])
                  for i in (0, 1)) == [3, 3]


def test_continue_final_message_without_messages_to_continue_is_a_400(service: FakeService) -> None:
    with service.client() as client:
        r = client.post("/v1/tokenize", json={"model": MODEL, "messages": [], "add_generation_prompt": False,
                                              "continue_final_message": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message", r.text


def test_truncation_side_right_keeps_the_prompts_first_tokens(service: FakeService) -> None:
    ids = list(range(10, 40))
    r = _post(service, "/v1/completions", {"prompt": ids, "truncate_prompt_tokens": 5, "truncation_side": "right"})
    assert r.status_code == 200, r.text
    assert service.engines.requests[-1][0] == ids[:5]
    r = _post(service, "/v1/completions", {"prompt": ids, "truncation_side": "middle"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "truncation_side", r.text


def test_truncate_to_the_context_leaves_room_for_the_completion_asked_for(service: FakeService) -> None:
    context = service.gateway.settings.max_model_len
    ids = [5] * (context + 50)
    r = _post(service, "/v1/completions", {"prompt": ids, "truncate_prompt_tokens": -1, "max_tokens": 7})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == context - 7, r.text
    r = _post(service, "/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * context}],
                                                "truncate_prompt_tokens": -1, "max_tokens": None})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == context - 1, r.text


def test_request_id_names_the_reply_and_priority_zero_is_served(service: FakeService) -> None:
    r = _post(service, "/v1/completions", {"prompt": "x", "request_id": "my-run.7", "priority": 0,
                                           "session_id": "conversation-1"})
    assert r.status_code == 200 and r.json()["id"] == "cmpl-my-run.7", r.text
    r = _post(service, "/v1/chat/completions", {"messages": CHAT, "request_id": "abc", "stream": True})
    assert r.status_code == 200
    ids = {json.loads(line[6:])["id"] for line in r.text.splitlines() if line.startswith("data: {")}
    assert ids == {"chatcmpl-abc"}


@pytest.mark.parametrize(("field", "value"), [("priority", 1), ("request_id", "a/b"), ("request_id", ""),
                                              ("cache_salt", ""), ("cache_salt", "a@b")])
def test_what_vllm_refuses_of_the_request_options_is_a_400(service: FakeService, field: str, value: Any) -> None:
    r = _post(service, "/v1/completions", {"prompt": "x", field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_cache_salt_reaches_the_engine_with_the_prompt(service: FakeService, path: str) -> None:
    body = {"cache_salt": "tenant-a", **({"messages": CHAT} if "chat" in path else {"prompt": "x"})}
    assert _post(service, path, body).status_code == 200
    assert service.engines.requests[-1][1].cache_salt == "tenant-a"


def test_chat_takes_vllms_reasoning_switches_as_no_ops(service: FakeService) -> None:
    r = _post(service, "/v1/chat/completions", {"messages": CHAT, "include_reasoning": False,
                                                "thinking_token_budget": 64})
    assert r.status_code == 200, r.text


def test_whole_replies_name_vllms_extras_null_when_not_asked_for(service: FakeService) -> None:
    completion = _post(service, "/v1/completions", {"prompt": "x"}).json()
    choice = completion["choices"][0]
    assert (choice["token_ids"], choice["prompt_token_ids"], choice["prompt_logprobs"]) == (None, None, None)
    chat = _post(service, "/v1/chat/completions", {"messages": CHAT}).json()
    assert (chat["prompt_token_ids"], chat["prompt_logprobs"], chat["choices"][0]["token_ids"]) == (None, None, None)


def test_tokenize_returns_token_strings_when_asked(service: FakeService) -> None:
    with service.client() as client:
        r = client.post("/v1/tokenize", json={"model": MODEL, "prompt": "def f", "return_token_strs": True}).json()
        plain = client.post("/v1/tokenize", json={"model": MODEL, "prompt": "def f"}).json()
    assert r["token_strs"] == service.engines.tokenizer.convert_ids_to_tokens(r["tokens"])
    assert plain["token_strs"] is None


def test_the_model_card_carries_vllms_root_parent_and_permission(service: FakeService) -> None:
    with service.client() as client:
        card = client.get(f"/v1/models/{MODEL}").json()
    assert card["root"] and "/" not in card["root"] and card["parent"] is None
    assert card["permission"][0]["object"] == "model_permission"


@pytest.mark.parametrize(("options", "spaced_extra_accepted"), [({}, False),
                                                                 ({"disable_any_whitespace": True}, False),
                                                                 ({"disable_any_whitespace": False,
                                                                   "disable_additional_properties": False}, True)])
def test_structured_json_options_choose_whitespace_and_extra_properties(service: FakeService, options: dict[str, Any],
                                                                        spaced_extra_accepted: bool) -> None:
    from xgrammar import Grammar
    from xgrammar.testing import _is_grammar_accept_string as accepts

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    r = _post(service, "/v1/completions", {"prompt": "x", "structured_outputs": {"json": schema, **options}})
    assert r.status_code == 200, r.text
    constraint = service.engines.requests[-1][1].constraint
    assert constraint is not None and constraint.grammar
    grammar = Grammar.from_ebnf(constraint.grammar)
    assert accepts(grammar, '{"a":1}')
    assert accepts(grammar, '{"a": 1, "b": 2}') is spaced_extra_accepted


def test_logprob_token_ids_reach_the_engine_and_need_logprobs(service: FakeService) -> None:
    r = _post(service, "/v1/completions", {"prompt": "x", "logprobs": 0, "logprob_token_ids": [5, 6, 7]})
    assert r.status_code == 200, r.text
    assert service.engines.requests[-1][1].logprob_token_ids == (5, 6, 7)
    for body in ({"prompt": "x", "logprob_token_ids": [5]},
                 {"prompt": "x", "logprobs": 1, "logprob_token_ids": [10**7]},
                 {"prompt": "x", "logprobs": 1, "logprob_token_ids": list(range(129))},
                 {"prompt": "x", "echo": True, "max_tokens": 0, "logprobs": 1, "logprob_token_ids": [5]}):
        r = _post(service, "/v1/completions", body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "logprob_token_ids", r.text
    r = _post(service, "/v1/chat/completions", {"messages": CHAT, "logprob_token_ids": [5]})
    assert r.status_code == 400 and "logprobs: true" in r.json()["error"]["message"], r.text


def test_repetition_detection_and_stream_interval_reach_the_engine(service: FakeService) -> None:
    r = _post(service, "/v1/completions", {"prompt": "x", "stream_interval": 4,
                                           "repetition_detection": {"max_pattern_size": 8, "min_count": 3}})
    assert r.status_code == 200, r.text
    request = service.engines.requests[-1][1]
    assert (request.repetition, request.stream_interval) == ((8, 0, 3), 4)
    _post(service, "/v1/completions", {"prompt": "x", "repetition_detection": {}})
    assert service.engines.requests[-1][1].repetition is None  # all zero: off


@pytest.mark.parametrize("wanted", [{"max_pattern_size": 4, "min_count": 1},
                                    {"max_pattern_size": 2, "min_pattern_size": 3, "min_count": 2},
                                    {"max_pattern_size": 300, "min_count": 2}])
def test_repetition_detection_vllm_would_refuse_is_a_400(service: FakeService, wanted: dict[str, int]) -> None:
    r = _post(service, "/v1/completions", {"prompt": "x", "repetition_detection": wanted})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("repetition_detection"), r.text


def test_chat_return_prompt_text_shows_the_rendered_prompt(service: FakeService) -> None:
    reply = _post(service, "/v1/chat/completions", {"messages": CHAT, "return_prompt_text": True}).json()
    assert reply["prompt_text"] == "user: x\nassistant:"
    streamed = _post(service, "/v1/chat/completions", {"messages": CHAT, "return_prompt_text": True,
                                                      "stream": True})
    chunks = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    assert [c.get("prompt_text") for c in chunks][:2] == ["user: x\nassistant:", None]


def test_tools_sent_with_tool_choice_none_reach_a_template_that_reads_them(service: FakeService,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    tokenizer = service.engines.tokenizer
    _post(service, "/v1/chat/completions", {"messages": CHAT, "tools": tools, "tool_choice": "none"})
    assert "tools" not in tokenizer.template_options  # type: ignore[attr-defined]
    monkeypatch.setattr(tokenizer, "chat_template", tokenizer.chat_template + "{{ tools }}")
    r = _post(service, "/v1/chat/completions", {"messages": CHAT, "tools": tools, "tool_choice": "none"})
    assert r.status_code == 200, r.text
    assert tokenizer.template_options["tools"] == tools  # type: ignore[attr-defined]


def test_a_reply_names_vllms_message_fields_null_and_takes_them_back_as_history(service: FakeService) -> None:
    reply = _post(service, "/v1/chat/completions", {"messages": CHAT}).json()
    message = reply["choices"][0]["message"]
    assert {k: message[k] for k in ("refusal", "annotations", "audio", "function_call", "reasoning")} == \
        dict.fromkeys(("refusal", "annotations", "audio", "function_call", "reasoning"))
    history = [*CHAT, message, {"role": "user", "content": "again"}]
    assert _post(service, "/v1/chat/completions", {"messages": history}).status_code == 200


def test_an_assistant_turns_reasoning_reaches_the_template(service: FakeService, monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    seen: list[list[dict[str, Any]]] = []
    tokenizer = service.engines.tokenizer
    original = tokenizer.apply_chat_template
    monkeypatch.setattr(tokenizer, "apply_chat_template",
                        lambda messages, **kw: seen.append(messages) or original(messages, **kw))
    history = [*CHAT, {"role": "assistant", "content": "4", "reasoning_content": "2+2"},
               {"role": "user", "content": "and 3+3?"}]
    assert _post(service, "/v1/chat/completions", {"messages": history}).status_code == 200
    assert seen[-1][1]["reasoning_content"] == "2+2"
    r = _post(service, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "reasoning": "y"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.0.reasoning", r.text


@pytest.mark.parametrize(("field", "value"), [("stream_interval", 2**64), ("stream_interval", 10**30),
                                              ("repetition_detection", {"max_pattern_size": 4, "min_count": 2**64}),
                                              ("repetition_detection", {"max_pattern_size": 4,
                                                                        "min_pattern_size": 2**64, "min_count": 2})])
def test_numbers_past_what_the_engine_can_take_are_a_400(service: FakeService, field: str, value: Any) -> None:
    r = _post(service, "/v1/completions", {"prompt": "x", field: value})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith(field), r.text


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_text_to_truncate_is_bounded_by_max_tokenize_chars(service: FakeService, path: str) -> None:
    size = service.gateway.settings.max_tokenize_chars + 1
    text = "a" * size
    body = {"messages": [{"role": "user", "content": text}]} if "chat" in path else {"prompt": text}
    r = _post(service, path, {**body, "truncate_prompt_tokens": 100})
    assert r.status_code == 400 and str(size) in r.json()["error"]["message"], r.text
