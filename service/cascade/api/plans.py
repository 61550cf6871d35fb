"""What a completion or chat completion runs (``Plan``): prompts, the engine request and how to report
it, built from a chat request by ``chat_plan`` (chat completions and the Responses API run it) and
run by ``run_plan``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from cascade.api.beam_search import beam_search_reply
from cascade.api.completion_render import (
    Choice,
    Kind,
    continuous_usage,
    prompt_entries,
    prompt_logprobs_body,
    stream_flags,
    usage,
)
from cascade.api.deps import get_gateway, name_reply
from cascade.api.errors import APIError
from cascade.api.input_bounds import check_words
from cascade.api.openai_protocol import ChatCompletionRequest, CompletionRequest
from cascade.api.predictions import PredictionUsage, predicted
from cascade.api.prompts import chat_prompt_from_messages, text_bound, truncated
from cascade.api.sampling import (
    check_model,
    generation_request,
    resolve_max_tokens,
    shown_alternatives,
    unsupported_fields,
)
from cascade.api.streaming import merge
from cascade.api.structured import output_constraint
from cascade.codec.sampling_codec import SamplingEncoder
from cascade.engine.config import EngineRole
from cascade.engine.manager import EngineManager
from cascade.engine.types import CompletionDelta, Generation, GenerationRequest
from cascade.export.token_table import TokenTable
from cascade.settings import Settings


@dataclass
class Plan:
    """What to run: prompts (token ids), engine role and request, and how to report it."""

    kind: Kind
    prompts: list[list[int]]
    request: GenerationRequest
    stream: bool
    include_usage: bool
    top_logprobs: int | None
    role: EngineRole = EngineRole.MAIN
    predictions: PredictionUsage = field(default_factory=PredictionUsage)
    codec: SamplingEncoder | None = None
    continuous_usage: bool = False
    cached_tokens: dict[int, int] = field(default_factory=dict)
    tokens: TokenTable | None = None
    """Spells the tokens of logprobs (set when they were asked for)."""
    echo: list[str] | None = None
    """Each prompt's text, put before its completions (a completion's ``echo``), or a chat's last
    assistant message, put before the reply (vLLM's chat ``echo``)."""
    echo_logprobs: dict[int, tuple[list[dict[str, Any]], list[int]]] = field(default_factory=dict)
    score_only: bool = False
    """``echo`` with ``max_tokens`` 0: the engine samples one token for the prompt's scores; none is shown."""
    prompt_logprobs: int | None = None
    """vLLM's ``prompt_logprobs``: alternatives shown per prompt token (set when asked for)."""
    prompt_scores: dict[int, list[dict[str, dict[str, Any]] | None]] = field(default_factory=dict)
    return_token_ids: bool = False
    tokens_as_ids: bool = False
    """vLLM's ``return_tokens_as_token_ids``: logprobs name tokens ``token_id:<id>``."""
    prompt_text: str | None = None
    """vLLM's chat ``return_prompt_text``: the rendered prompt, shown once (set when asked for)."""

    def observe(self, prompt_index: int, output: Generation) -> None:
        """Remember how many prompt tokens the engine's prefix cache served (reported per prompt), and
        an echoed prompt's log-probabilities (they come with its first output)."""
        if output.cached_tokens is not None:
            self.cached_tokens[prompt_index] = output.cached_tokens
        if output.prompt_logprobs is not None and self.prompt_logprobs is not None:
            self.prompt_scores[prompt_index] = prompt_logprobs_body(self.prompts[prompt_index], output.prompt_logprobs,
                                                                    self.prompt_logprobs)
        if (self.kind == "completion" and output.prompt_logprobs is not None and self.top_logprobs is not None
                and self.echo and self.tokens):
            self.echo_logprobs[prompt_index] = prompt_entries(self.prompts[prompt_index], self.echo[prompt_index],
                                                              output.prompt_logprobs, self.top_logprobs, self.tokens,
                                                              self.tokens_as_ids)

    def shown(self, delta: CompletionDelta) -> CompletionDelta:
        """What the client sees of a delta: nothing of it when only the prompt is scored."""
        if not self.score_only:
            return delta
        return CompletionDelta(delta.index, "", (), "length" if delta.finish_reason is not None else None, ())

    def echoed(self, prompt_index: int) -> Choice:
        """A choice's start: its prompt when echoed (text, and logprobs when asked for), else nothing."""
        if self.echo is None:
            return Choice()
        entries, characters = self.echo_logprobs.get(prompt_index, ([], []))
        return Choice(text=self.echo[prompt_index], logprobs=list(entries), characters=list(characters))

    def check_failed(self, delta: CompletionDelta) -> None:
        """vLLM ends a request it could not serve with finish reason ``"error"`` and no text; that is an
        error reply, not a choice. With an output constraint it is the constraint's grammar, which the
        engine's compiler refused after admitting the request (``root ::= ``): the client's 400."""
        if delta.finish_reason != "error":
            return
        if (constraint := self.request.constraint) is not None:
            raise APIError(400, f"the engine could not compile this request's output constraint "
                                f"({constraint.source})", param=constraint.source, code="invalid_value")
        raise APIError(500, "the engine failed while generating this request", code="engine_error")

    def observe_delta(self, delta: CompletionDelta) -> None:
        """Collect per-sequence statistics and the tokens the codec will code."""
        self.predictions.add(delta.prediction)
        if self.codec is not None:
            self.codec.observe(delta.token_ids)

    def usage(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        return usage(prompt_tokens, completion_tokens, sum(self.cached_tokens.values()), self.predictions)

    def prompt_fields(self, index: int, first: bool, nulls: bool = False) -> dict[str, Any]:
        """vLLM's prompt extras: a completion choice carries its prompt's, a chat reply carries them at the
        top (``index`` is a choice's; a stream sends them with a choice's first chunk). ``nulls``: a
        whole reply names them null when not asked for, as vLLM's does (its clients test ``is None``)."""
        prompt_index = index // self.request.n
        extras: dict[str, Any] = {"prompt_token_ids": None, "prompt_logprobs": None} if nulls else {}
        if first and self.prompt_text is not None:
            extras["prompt_text"] = self.prompt_text
        if first and self.return_token_ids:
            extras["prompt_token_ids"] = self.prompts[prompt_index]
        if first and self.prompt_logprobs is not None:
            extras["prompt_logprobs"] = self.prompt_scores.get(prompt_index)
        return extras

    def choice_fields(self, index: int, token_ids: Sequence[int], first: bool, nulls: bool = False
                      ) -> dict[str, Any]:
        """What vLLM adds to a completion choice or chat choice (``return_token_ids``, ``prompt_logprobs``)."""
        extras = self.prompt_fields(index, first, nulls) if self.kind == "completion" else {}
        if self.return_token_ids or nulls:
            extras["token_ids"] = list(token_ids) if self.return_token_ids else None
        return extras


def engine_streams(engines: EngineManager, plan: Plan, rid: str) -> list[AsyncIterator[Generation]]:
    return [engines.generate(prompt, plan.request, f"{rid}-{i}", plan.role) for i, prompt in enumerate(plan.prompts)]


async def run_plan(engines: EngineManager, plan: Plan, rid: str) -> dict[int, Choice]:
    choices: dict[int, Choice] = {}
    async for prompt_index, output in merge(engine_streams(engines, plan, rid)):
        plan.observe(prompt_index, output)
        for delta in map(plan.shown, output.completions):
            plan.check_failed(delta)
            index = prompt_index * plan.request.n + delta.index
            if index not in choices:
                choices[index] = plan.echoed(prompt_index)
            choices[index].add(delta, plan.top_logprobs, plan.kind, plan.tokens, plan.tokens_as_ids)
            plan.observe_delta(delta)
    return choices


def admit(body: CompletionRequest | ChatCompletionRequest, request: Request, settings: Settings,
          engines: EngineManager) -> None:
    """What a completion or chat completion checks first: the model, the fields it refuses, the sizes of
    its words, a ready engine; then the reply's name (vLLM's ``request_id``)."""
    check_model(body.model, settings)
    unsupported_fields(body)
    check_words(body, settings)
    engines.check_ready()
    name_reply(request, body.request_id)


async def chat_plan(body: ChatCompletionRequest, request: Request, settings: Settings,
                    engines: EngineManager) -> Plan | JSONResponse:
    """Everything a chat completion runs, from its checks to the engine request (the Responses API runs it
    too); a beam search is answered whole."""
    admit(body, request, settings, engines)
    keep = body.truncate_prompt_tokens
    rendered = await chat_prompt_from_messages(
        engines, body.messages, text_bound(keep, settings.max_model_len, settings.max_tokenize_chars,
                                           sum(len(m.text()) for m in body.messages), "messages"),
        add_generation_prompt=body.add_generation_prompt, continue_final_message=body.continue_final_message,
        template_kwargs=body.chat_template_kwargs, add_special_tokens=body.add_special_tokens, tools=body.tools)
    param, asked = body.asked_tokens()
    [prompt] = truncated([rendered], keep, settings.max_model_len, body.truncation_side, asked)
    max_tokens = resolve_max_tokens(asked, len(prompt), settings, param, prompt_param="messages")
    top = (body.top_logprobs or 0) if body.logprobs else None
    if body.top_logprobs and not body.logprobs:
        raise APIError(400, "top_logprobs requires logprobs=true", param="top_logprobs")
    echo = [body.messages[-1].text()] if body.echo and body.messages[-1].role == "assistant" else None
    if body.use_beam_search:
        return await beam_search_reply(request, body, "chat", [prompt], echo, get_gateway(request), top)
    stream, include_usage = stream_flags(body)
    prediction = await predicted(body, engines, settings)
    sampling = generation_request(body, max_tokens=max_tokens, logprobs=top, settings=settings,
                                  vocab_size=len(engines.tokenizer), stream=stream, prediction=prediction,
                                  constraint=await output_constraint(body, settings),
                                  prompt_logprobs=body.prompt_logprobs)
    plan = Plan("chat", [prompt], sampling, stream, include_usage, shown_alternatives(body, top),
                role=EngineRole.PREDICT if prediction else EngineRole.MAIN, continuous_usage=continuous_usage(body),
                tokens=get_gateway(request).token_table() if top is not None else None,
                prompt_logprobs=body.prompt_logprobs, return_token_ids=body.return_token_ids,
                tokens_as_ids=body.return_tokens_as_token_ids, echo=echo,
                prompt_text=await asyncio.to_thread(engines.tokenizer.decode, prompt) if body.return_prompt_text
                else None)
    return plan


