"""The OpenAI surface through the official SDK, against the real engine."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.conftest import MODEL

CODE_PROMPT = "import os\n\ndef "
# Greedy continuation recorded in the model card (vLLM and transformers agree on it).
CARD_CONTINUATION = 'utf8_survival(s):\n    """\n    Convert a UTF-8 string to a survival of the value.'


def test_models_lists_the_default_model(openai_client) -> None:
    ids = [m.id for m in openai_client.models.list().data]
    assert ids == [MODEL]


def test_greedy_completion_matches_model_card(openai_client) -> None:
    out = openai_client.completions.create(model=MODEL, prompt=CODE_PROMPT, max_tokens=24, temperature=0)
    assert out.choices[0].text.startswith(CARD_CONTINUATION[:40])
    assert out.choices[0].finish_reason == "length"
    assert out.usage.prompt_tokens == 6
    assert out.usage.completion_tokens == 24
    assert out.usage.total_tokens == 30


def test_streamed_completion_equals_non_streamed(openai_client) -> None:
    full = openai_client.completions.create(model=MODEL, prompt=CODE_PROMPT, max_tokens=20, temperature=0)
    chunks = list(openai_client.completions.create(model=MODEL, prompt=CODE_PROMPT, max_tokens=20, temperature=0,
                                                   stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 20
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]


def test_chat_completion_uses_chat_template_and_reports_usage(openai_client, service) -> None:
    out = openai_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "write a function"}], max_tokens=8, temperature=0)
    message = out.choices[0].message
    assert message.role == "assistant" and isinstance(message.content, str) and message.content
    # "<|user|>\nwrite a function\n<|assistant|>\n" tokenised
    assert out.usage.prompt_tokens > 5
    assert out.usage.completion_tokens == 8
    assert out.choices[0].finish_reason == "length"


def test_tokenize_renders_chat_messages_as_chat_completions_do(openai_client, service) -> None:
    """vLLM's ``/tokenize`` with ``messages``: the ids a chat completion's prompt counts."""
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "write a function"}]
    out = openai_client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1, temperature=0)
    with service.client() as client:
        chat = client.post("/v1/tokenize", json={"model": MODEL, "messages": messages}).json()
        bare = client.post("/tokenize", json={"model": MODEL, "messages": messages,
                                              "add_generation_prompt": False}).json()
        both = client.post("/v1/tokenize", json={"model": MODEL, "messages": messages, "prompt": "x"})
    assert chat["count"] == len(chat["tokens"]) == out.usage.prompt_tokens
    assert chat["tokens"][:len(bare["tokens"])] == bare["tokens"] and bare["count"] < chat["count"]
    assert both.status_code == 400 and both.json()["error"]["code"]


def test_chat_stream_sends_role_then_content_then_usage(openai_client) -> None:
    stream = openai_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    full = openai_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=6, temperature=0)
    assert streamed == full.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6


def test_stop_sequence_ends_generation_with_stop_reason(openai_client) -> None:
    out = openai_client.completions.create(model=MODEL, prompt=CODE_PROMPT, max_tokens=40, temperature=0,
                                           stop=["zzz", "\n"])
    assert out.choices[0].text == "utf8_survival(s):"
    assert out.choices[0].finish_reason == "stop"
    assert out.choices[0].model_extra["stop_reason"] == "\n"  # vLLM's: which stop sequence ended it


@pytest.mark.parametrize("stream", [False, True])
def test_include_stop_str_in_output_keeps_the_stop_sequence_and_nothing_after_it(openai_client, stream: bool) -> None:
    """vLLM's extension, as its own server takes it (``extra_body``); the text ends where the stop ends."""
    kwargs = {"model": MODEL, "prompt": CODE_PROMPT, "max_tokens": 40, "temperature": 0, "stop": ["(s"],
              "extra_body": {"include_stop_str_in_output": True}, "stream": stream}
    out = openai_client.completions.create(**kwargs)
    if stream:
        chunks = list(out)
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    else:
        text, finish = out.choices[0].text, [out.choices[0].finish_reason]
    assert (text, finish) == ("utf8_survival(s", ["stop"])


def test_seeded_sampling_is_reproducible_and_n_gives_indexed_choices(openai_client) -> None:
    kwargs = {"model": MODEL, "prompt": CODE_PROMPT, "max_tokens": 12, "temperature": 1.0, "seed": 1234, "n": 3}
    first = openai_client.completions.create(**kwargs)
    second = openai_client.completions.create(**kwargs)
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert [c.text for c in first.choices] == [c.text for c in second.choices]
    assert first.usage.completion_tokens == 36


def test_chat_logprobs_report_top_alternatives(openai_client) -> None:
    out = openai_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4, temperature=0, logprobs=True,
        top_logprobs=3)
    content = out.choices[0].logprobs.content
    assert len(content) == 4
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-5)  # greedy = best
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token


def test_completion_logprobs_use_legacy_shape(openai_client) -> None:
    out = openai_client.completions.create(model=MODEL, prompt=CODE_PROMPT, max_tokens=3, temperature=0,
                                           logprobs=2)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 3
    assert "".join(lp.tokens) == out.choices[0].text
    assert lp.text_offset[0] == 0


def test_echo_with_logprobs_scores_every_prompt_token_as_lm_eval_reads_it(openai_client, service) -> None:
    """A log-likelihood request as lm-evaluation-harness sends it (token ids, echo, logprobs 1,
    max_tokens 1, temperature 0): one entry per prompt token and the new one, the first without a
    logprob; each score is the model's for that token after the tokens before it, so a shorter
    prompt gives the same scores for the positions they share, and the new token is what the same
    request without echo samples."""
    with service.client() as client:
        ids = client.post("/v1/tokenize", json={"model": MODEL, "prompt": CODE_PROMPT}).json()["tokens"]

    def score(prompt: list[int]) -> object:
        return openai_client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0, logprobs=1,
                                                echo=True)

    full, shorter = score(ids), score(ids[:-2])
    lp = full.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(ids) + 1
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert full.choices[0].text.startswith(CODE_PROMPT) and "".join(lp.tokens).endswith(full.choices[0].text[-1:])
    for token, logprob, top in zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:], strict=True):
        assert logprob <= 0 and top[token] == logprob and logprob <= max(top.values())
    shared = shorter.choices[0].logprobs.token_logprobs[1:len(ids) - 2]
    assert shared == pytest.approx(lp.token_logprobs[1:len(ids) - 2], abs=1e-4)
    prompt_only = openai_client.completions.create(model=MODEL, prompt=ids, max_tokens=0, logprobs=1, echo=True)
    prompt_scores = prompt_only.choices[0].logprobs.token_logprobs
    assert prompt_scores[0] is None and prompt_scores[1:] == pytest.approx(lp.token_logprobs[1:-1], abs=1e-4)
    assert prompt_only.choices[0].text == CODE_PROMPT and prompt_only.usage.completion_tokens == 0
    plain = openai_client.completions.create(model=MODEL, prompt=ids, max_tokens=1, temperature=0, logprobs=1)
    assert lp.tokens[-1] == plain.choices[0].logprobs.tokens[0]
    assert lp.token_logprobs[-1] == pytest.approx(plain.choices[0].logprobs.token_logprobs[0], abs=1e-4)


def test_a_scored_window_holds_one_token_less_than_the_context_and_longer_ones_are_told_so(
        openai_client, service) -> None:
    """A rolling-window evaluation scores windows with echo and max_tokens 0. vLLM takes a prompt's
    log-probabilities only while it runs one token past it, so a window of max_model_len − 1 tokens is
    scored whole and a full window is a 400 that says how long a scored prompt may be."""
    window = 1024  # the default service's max_model_len
    with service.client() as client:
        ids = client.post("/v1/tokenize", json={"model": MODEL, "prompt": CODE_PROMPT * 400}).json()["tokens"]
        scored = openai_client.completions.create(model=MODEL, prompt=ids[:window - 1], max_tokens=0, logprobs=0,
                                                  echo=True)
        full = client.post("/v1/completions", json={"model": MODEL, "prompt": ids[:window], "max_tokens": 0,
                                                     "logprobs": 0, "echo": True})
    scores = scored.choices[0].logprobs.token_logprobs
    assert len(scores) == window - 1 and scores[0] is None and all(s <= 0 for s in scores[1:])
    assert scored.usage.prompt_tokens == window - 1 and scored.usage.completion_tokens == 0
    error = full.json()["error"]
    assert full.status_code == 400 and error["code"] == "context_length_exceeded", full.text
    assert f"at most {window - 1} tokens" in error["message"] and error["param"] == "prompt"


def test_batched_prompts_give_one_choice_per_prompt(openai_client) -> None:
    out = openai_client.completions.create(model=MODEL, prompt=["import sys\n", CODE_PROMPT], max_tokens=5,
                                           temperature=0)
    assert [c.index for c in out.choices] == [0, 1]
    single = openai_client.completions.create(model=MODEL, prompt=CODE_PROMPT, max_tokens=5, temperature=0)
    assert out.choices[1].text == single.choices[0].text


def test_concurrent_async_clients_are_all_served(service) -> None:
    from openai import AsyncOpenAI

    async_openai_client = AsyncOpenAI(base_url=service.base_url + "/v1", api_key=service.api_key, max_retries=0)

    async def one(i: int) -> str:
        out = await async_openai_client.completions.create(model=MODEL, prompt=f"x = {i}\n", max_tokens=8,
                                                           temperature=0)
        return out.choices[0].text

    async def main() -> list[str]:
        return await asyncio.gather(*(one(i) for i in range(12)))

    results = asyncio.run(main())
    assert len(results) == 12 and all(isinstance(r, str) and r for r in results)
