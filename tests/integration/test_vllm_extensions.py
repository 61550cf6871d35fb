"""vLLM's request extensions through the SDK's ``extra_body``, as a client of vLLM's own server sends
them, against the real engine: the answer is what vLLM's server would give."""

from __future__ import annotations

import json
import re
import uuid

import pytest

from tests.integration.conftest import MODEL

CODE_PROMPT = "import os\n\ndef "


@pytest.mark.parametrize("stream", [False, True])
def test_structured_outputs_choice_and_regex_constrain_the_completion(openai_client, stream: bool) -> None:
    def text(extra: dict[str, object]) -> str:
        out = openai_client.completions.create(model=MODEL, prompt=CODE_PROMPT, max_tokens=12, temperature=0,
                                               stream=stream, extra_body=extra)
        return "".join(c.choices[0].text for c in out if c.choices) if stream else out.choices[0].text

    assert text({"structured_outputs": {"choice": ["alpha", "beta"]}}) in ("alpha", "beta")
    assert re.fullmatch(r"[0-9]{3}", text({"structured_outputs": {"regex": "[0-9]{3}"}}))


def test_structured_outputs_json_schema_gives_a_compact_valid_document(openai_client) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    out = openai_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x = "}], max_tokens=40, temperature=0,
        extra_body={"structured_outputs": {"json": schema}})
    content = out.choices[0].message.content
    assert out.choices[0].finish_reason == "stop", content
    assert isinstance(json.loads(content)["a"], int) and " " not in content


def test_a_regex_the_engine_cannot_compile_is_a_400(service) -> None:
    with service.client() as client:
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 4,
                                                 "structured_outputs": {"regex": "[0-9"}})
    assert r.status_code == 400 and "regex" in r.json()["error"]["message"], r.text


def test_skip_special_tokens_false_keeps_special_tokens_in_the_text(service) -> None:
    with service.client() as client:
        special = client.post("/v1/detokenize", json={"model": MODEL, "tokens": [2]}).json()["prompt"]
        body = {"model": MODEL, "prompt": "x", "max_tokens": 3, "temperature": 0, "ignore_eos": True,
                "allowed_token_ids": [2]}
        kept = client.post("/v1/completions", json={**body, "skip_special_tokens": False}).json()
        skipped = client.post("/v1/completions", json=body).json()
    assert special.startswith("<") and kept["choices"][0]["text"] == special * 3, kept
    assert skipped["choices"][0]["text"] == "", skipped


def test_truncate_prompt_tokens_answers_as_the_prompts_last_tokens_alone(openai_client, service) -> None:
    long_prompt = "# padding line\n" * 40 + CODE_PROMPT
    with service.client() as client:
        ids = client.post("/v1/tokenize", json={"model": MODEL, "prompt": long_prompt}).json()["tokens"]
    truncated = openai_client.completions.create(model=MODEL, prompt=long_prompt, max_tokens=12, temperature=0,
                                                 extra_body={"truncate_prompt_tokens": 6})
    tail = openai_client.completions.create(model=MODEL, prompt=ids[-6:], max_tokens=12, temperature=0)
    assert truncated.usage.prompt_tokens == 6
    assert truncated.choices[0].text == tail.choices[0].text


def test_continue_final_message_continues_the_assistants_text(openai_client, service) -> None:
    """The reply continues a started assistant turn: the prompt is the chat rendered up to that text
    (no end of turn after it), as ``/tokenize`` with the same options shows."""
    messages = [{"role": "user", "content": "write a function"}, {"role": "assistant", "content": "def add("}]
    options = {"add_generation_prompt": False, "continue_final_message": True}
    out = openai_client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0,
                                                extra_body=options)
    with service.client() as client:
        ids = client.post("/v1/tokenize", json={"model": MODEL, "messages": messages, **options}).json()["tokens"]
        rendered = client.post("/v1/detokenize", json={"model": MODEL, "tokens": ids}).json()["prompt"]
    assert rendered.endswith("def add(")
    assert out.usage.prompt_tokens == len(ids)
    plain = openai_client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0)
    assert out.choices[0].message.content == plain.choices[0].text


def test_chat_template_kwargs_reach_the_template_and_unused_ones_change_nothing(openai_client) -> None:
    messages = [{"role": "user", "content": "write a function"}]
    plain = openai_client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0)
    with_kwargs = openai_client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=6, temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    no_generation_prompt = openai_client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=6, temperature=0, extra_body={"add_generation_prompt": False})
    assert with_kwargs.choices[0].message.content == plain.choices[0].message.content
    assert no_generation_prompt.usage.prompt_tokens < plain.usage.prompt_tokens


def test_prompt_logprobs_agree_with_the_echoed_prompts_logprobs(openai_client) -> None:
    out = openai_client.completions.create(model=MODEL, prompt=CODE_PROMPT, max_tokens=2, temperature=0, echo=True,
                                           logprobs=1, extra_body={"prompt_logprobs": 2, "return_token_ids": True})
    choice = out.choices[0].model_dump()
    scores, ids = choice["prompt_logprobs"], choice["prompt_token_ids"]
    assert scores[0] is None and len(scores) == len(ids)
    echoed = choice["logprobs"]["token_logprobs"][1:len(ids)]
    assert [scores[i][str(t)]["logprob"] for i, t in enumerate(ids) if i] == pytest.approx(echoed)
    for position in scores[1:]:
        assert {entry["rank"] for entry in position.values()} >= {1, 2}


@pytest.mark.parametrize("stream", [False, True])
def test_return_token_ids_are_the_prompts_and_the_texts_tokens(openai_client, service, stream: bool) -> None:
    out = openai_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "write a function"}], max_tokens=10, temperature=0,
        stream=stream, extra_body={"return_token_ids": True})
    if stream:
        chunks = [c.model_dump() for c in out]
        prompt_ids = [c["prompt_token_ids"] for c in chunks if c.get("prompt_token_ids")]
        ids = [t for c in chunks for choice in c["choices"] for t in choice.get("token_ids") or []]
        text = "".join(choice["delta"]["content"] or "" for c in chunks for choice in c["choices"])
        assert len(prompt_ids) == 1
        prompt = prompt_ids[0]
    else:
        body = out.model_dump()
        prompt, ids, text = body["prompt_token_ids"], body["choices"][0]["token_ids"], out.choices[0].message.content
    with service.client() as client:
        rendered = client.post("/v1/tokenize", json={"model": MODEL, "messages": [
            {"role": "user", "content": "write a function"}]}).json()["tokens"]
        decoded = client.post("/v1/detokenize", json={"model": MODEL, "tokens": ids}).json()["prompt"]
    assert prompt == rendered and len(ids) == 10 and decoded == text


@pytest.mark.parametrize("stream", [False, True])
def test_a_grammar_the_engine_fails_to_compile_after_admitting_it_is_an_error_not_an_empty_choice(
        service, stream: bool) -> None:
    """vLLM picks one grammar backend per engine for its first constrained request; once it is
    xgrammar, it admits ``root ::= `` and then ends the request with finish reason ``error`` and no
    text. The client gets a 400 naming the constraint (an error event once streaming), never a
    choice finished by ``error``."""
    body = {"model": MODEL, "prompt": "x", "max_tokens": 4, "stream": stream}
    with service.client() as client:
        first = client.post("/v1/completions", json={**body, "stream": False,
                                                     "structured_outputs": {"json_object": True}})
        assert first.status_code == 200, first.text
        r = client.post("/v1/completions", json={**body, "structured_outputs": {"grammar": "root ::= "}})
        assert '"finish_reason":"error"' not in r.text.replace(" ", ""), r.text
        if stream:
            errors = [json.loads(line[6:])["error"] for line in r.text.splitlines()
                      if line.startswith("data: {") and '"error"' in line]
            assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]"), r.text
            assert all(e["param"] == "structured_outputs" for e in errors), errors
        else:
            assert r.status_code in (200, 400), r.text
            if r.status_code == 400:
                assert r.json()["error"]["param"] == "structured_outputs"
        assert client.get("/ready").status_code == 200


def test_beam_search_answers_vllms_own_batch_test(openai_client) -> None:
    """vLLM's ``test_batch_completions``: ``n = 2`` at temperature 0 needs ``use_beam_search``."""
    for prompts in (["Hello, my name is"] * 2, [[0, 0, 0, 0, 0]] * 2):
        batch = openai_client.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=5, temperature=0.0,
                                                 extra_body={"use_beam_search": True})
        assert len(batch.choices) == 4
        assert batch.choices[0].text != batch.choices[1].text, "beams should differ"
        assert batch.choices[0].text == batch.choices[2].text
        assert batch.choices[1].text == batch.choices[3].text


def test_a_one_beam_search_is_greedy_decoding(openai_client) -> None:
    common = {"model": MODEL, "prompt": CODE_PROMPT, "max_tokens": 12, "temperature": 0}
    greedy = openai_client.completions.create(**common, extra_body={"ignore_eos": True})
    beam = openai_client.completions.create(**common, extra_body={"ignore_eos": True, "use_beam_search": True})
    assert beam.choices[0].text == greedy.choices[0].text
    assert beam.usage.completion_tokens == greedy.usage.completion_tokens == 12


def test_chat_beam_search_scores_beams_by_the_models_logprobs(openai_client) -> None:
    out = openai_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Name a colour."}], n=3, max_tokens=6,
        logprobs=True, extra_body={"use_beam_search": True, "length_penalty": 0.0})
    totals = [sum(t.logprob for t in c.logprobs.content) for c in out.choices]
    assert len(out.choices) == 3 and totals == sorted(totals, reverse=True)


def test_cache_salt_keeps_prefix_cache_blocks_to_requests_of_the_same_salt(openai_client) -> None:
    prompt = f"# {uuid.uuid4().hex}\n" + "def f(x):\n    return x\n" * 40

    def cached(salt: str | None) -> int:
        out = openai_client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0,
                                               extra_body={"cache_salt": salt} if salt else None)
        return out.usage.prompt_tokens_details.cached_tokens

    assert cached("tenant-a") == 0
    assert cached("tenant-a") > 0
    assert cached("tenant-b") == 0
    assert cached(None) == 0


def test_request_id_names_the_reply_and_the_model_card_has_a_root(openai_client) -> None:
    out = openai_client.completions.create(model=MODEL, prompt="x", max_tokens=1,
                                           extra_body={"request_id": "run-42"})
    assert out.id == "cmpl-run-42"
    assert out.choices[0].token_ids is None  # present and null, as vLLM's replies name it
    assert openai_client.models.retrieve(MODEL).root


@pytest.mark.parametrize("chat", [False, True])
def test_logprob_token_ids_score_the_named_tokens_at_every_position(openai_client, chat: bool) -> None:
    ids = [5, 17, 300]
    extra = {"logprob_token_ids": ids, "return_tokens_as_token_ids": True}
    if chat:
        out = openai_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                    max_tokens=4, temperature=0, logprobs=True, extra_body=extra)
        positions = [{t.token for t in p.top_logprobs} for p in out.choices[0].logprobs.content]
    else:
        out = openai_client.completions.create(model=MODEL, prompt=CODE_PROMPT, max_tokens=4, temperature=0,
                                               logprobs=0, extra_body=extra)
        positions = [set(p) for p in out.choices[0].logprobs.top_logprobs]
    assert len(positions) == 4
    assert all({f"token_id:{i}" for i in ids} <= names for names in positions)


def test_repetition_detection_ends_a_looping_completion(openai_client) -> None:
    common = {"model": MODEL, "prompt": "def add(a, b):\n", "max_tokens": 120, "temperature": 0}
    looping = openai_client.completions.create(**common, extra_body={"ignore_eos": True})
    cut = openai_client.completions.create(**common, extra_body={
        "ignore_eos": True, "repetition_detection": {"max_pattern_size": 24, "min_count": 3}})
    assert looping.choices[0].finish_reason == "length"
    assert cut.choices[0].finish_reason == "repetition"
    assert cut.usage.completion_tokens < 120
    assert looping.choices[0].text.startswith(cut.choices[0].text)


def test_the_responses_api_answers_the_sdk_and_continues_a_conversation(openai_client) -> None:
    first = openai_client.responses.create(model=MODEL, input="def add(a, b):", max_output_tokens=12,
                                           temperature=0)
    chat = openai_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "def add(a, b):"}],
                                                 max_tokens=12, temperature=0)
    assert first.output_text == chat.choices[0].message.content
    assert first.usage.input_tokens == chat.usage.prompt_tokens
    follow = openai_client.responses.create(model=MODEL, input="and sub?", previous_response_id=first.id,
                                            max_output_tokens=4, temperature=0)
    assert follow.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    streamed = list(openai_client.responses.create(model=MODEL, input="def add(a, b):", max_output_tokens=12,
                                                   temperature=0, stream=True))
    assert "".join(e.delta for e in streamed if e.type == "response.output_text.delta") == first.output_text


def test_responses_parse_gives_a_typed_object(openai_client) -> None:
    from pydantic import BaseModel

    class Point(BaseModel):
        x: int
        y: int

    parsed = openai_client.responses.parse(model=MODEL, input="A point:", text_format=Point, max_output_tokens=40,
                                           temperature=0)
    assert isinstance(parsed.output_parsed, Point) and parsed.status == "completed"
    with openai_client.responses.stream(model=MODEL, input="A point:", text_format=Point, max_output_tokens=40,
                                        temperature=0) as stream:
        final = stream.get_final_response()
    assert final.output_parsed == parsed.output_parsed
