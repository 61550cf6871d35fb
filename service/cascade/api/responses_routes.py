"""OpenAI's Responses API (``POST /v1/responses``, ``GET``/``DELETE /v1/responses/{id}``): what the
SDK's ``client.responses.create`` and ``.parse`` send, run as the chat completion it amounts to
(``plans.chat_plan``), answered as a response object or its stream of typed events.

A stored response (``store``, true by default as in OpenAI's) keeps its conversation, so a later
request continues it with ``previous_response_id``; the store is this process's memory, bounded by
``stored_responses_bytes`` (the oldest go first)."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError

from cascade.api.completion_render import Choice
from cascade.api.deps import get_engines, get_gateway, get_settings, request_id
from cascade.api.errors import APIError
from cascade.api.openai_protocol import ChatCompletionRequest, StrictModel
from cascade.api.plans import Plan, chat_plan, engine_streams, run_plan
from cascade.api.response_store import ResponseStore, Stored
from cascade.api.responses_protocol import InputMessage, ResponsesRequest, TextPart
from cascade.api.streaming import SSE_HEADERS, guarded, merge, primed, sse_event, until_disconnect
from cascade.engine.manager import EngineManager
from cascade.lifecycle import Gateway
from cascade.settings import Settings

router = APIRouter(prefix="/v1", tags=["responses"])


LOGPROBS_INCLUDE = "message.output_text.logprobs"


def _store(request: Request) -> ResponseStore:
    return get_gateway(request).responses


def _refuse(body: ResponsesRequest) -> None:
    if body.tools:
        raise APIError(400, "tools are not supported by this model", param="tools", code="unsupported_parameter")
    if body.reasoning and any(v is not None for v in body.reasoning.values()):
        raise APIError(400, "reasoning is not supported by this model: it has no reasoning setting",
                       param="reasoning", code="unsupported_parameter")
    if body.background:
        raise APIError(400, "background responses are not supported: send the request and wait, or stream it",
                       param="background", code="unsupported_parameter")
    for item in body.include or []:
        if item != LOGPROBS_INCLUDE:
            raise APIError(400, f"include may only name {LOGPROBS_INCLUDE!r} here (this model has no tools, "
                                "images or reasoning)", param="include", code="unsupported_parameter")
    if body.stream_options is not None and not body.stream:
        raise APIError(400, "stream_options is only allowed with stream=true", param="stream_options")


TEXT_PARTS = ("input_text", "output_text", "refusal")


def _check_parts(content: object, item: int) -> None:
    """A content list's parts are text: an image, a file or audio, or a part that is not a text part,
    is refused at its own place (``input.I.content.J…``), not as a content that failed to be a string."""
    if not isinstance(content, list):
        return
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        where = f"input.{item}.content.{j}"
        if kind not in TEXT_PARTS:
            raise APIError(400, f"content parts of type {kind!r} are not supported: this model reads text "
                                f"({', '.join(TEXT_PARTS)})", param=f"{where}.type", code="unsupported_content")
        _validated(TextPart, part, where)


M = TypeVar("M", bound=StrictModel)


def _validated(model: type[M], value: object, where: str) -> M:
    """``value`` as ``model``; its first error is a 400 at its place below ``where``."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        place = ".".join([where, *(str(p) for p in first["loc"])])
        raise APIError(400, f"{place}: {first['msg']}", param=place) from None


def _input_messages(body: ResponsesRequest) -> list[dict[str, Any]]:
    if isinstance(body.input, str):
        return [{"role": "user", "content": body.input}]
    messages = []
    for i, item in enumerate(body.input):
        kind = item.get("type", "message")
        if kind != "message":
            raise APIError(400, f"input items of type {kind!r} are not supported: this model reads messages "
                                "of text", param=f"input.{i}.type", code="unsupported_content")
        _check_parts(item.get("content"), i)
        message = _validated(InputMessage, item, f"input.{i}")
        messages.append({"role": message.role, "content": message.text()})
    if not messages:
        raise APIError(400, "input must hold at least one message", param="input")
    return messages


def _response_format(body: ResponsesRequest) -> dict[str, Any] | None:
    fmt = body.text.format if body.text is not None else None
    if fmt is None or fmt.type != "json_schema":
        return None if fmt is None else {"type": fmt.type}
    if fmt.name is None or fmt.schema_ is None:
        raise APIError(400, "text.format of type json_schema needs a name and a schema", param="text.format")
    return {"type": "json_schema", "json_schema": {"name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict,
                                                   "description": fmt.description}}


_CHAT_NAMES = {"max_completion_tokens": "max_output_tokens", "response_format.json_schema": "text.format",
               "response_format": "text.format"}


@dataclass(frozen=True)
class _Names:
    """How a chat completion's fields read in the Responses API: its messages are the instructions,
    then the earlier conversation (``previous_response_id``), then ``input`` from ``offset`` on."""

    instructions: bool
    offset: int

    def param(self, param: str | None) -> str | None:
        if param is None:
            return None
        for chat_name, name in _CHAT_NAMES.items():
            if param == chat_name or param.startswith(chat_name + "."):
                return name + param[len(chat_name):]
        head, _, rest = param.partition(".")
        if head != "messages":
            return param
        index, _, below = rest.partition(".")
        if not index.isdigit():
            return "input"
        if int(index) >= self.offset:
            return ".".join(filter(None, ["input", str(int(index) - self.offset), below]))
        return "instructions" if self.instructions and index == "0" else "previous_response_id"

    def message(self, message: str) -> str:
        for chat_name, name in _CHAT_NAMES.items():
            message = message.replace(chat_name, name)
        return message

    def error(self, error: APIError) -> APIError:
        """A chat completion's error in the Responses API's words."""
        return APIError(error.status, self.message(error.message), param=self.param(error.param), code=error.code)


def _instructions(body: ResponsesRequest) -> list[dict[str, Any]]:
    return [{"role": "system", "content": body.instructions}] if body.instructions else []


def _chat_request(body: ResponsesRequest, history: list[dict[str, Any]], messages: list[dict[str, Any]]
                  ) -> ChatCompletionRequest:
    instructions = _instructions(body)
    logprobs = body.top_logprobs is not None or LOGPROBS_INCLUDE in (body.include or [])
    return ChatCompletionRequest.model_validate({
        "model": body.model, "messages": [*instructions, *history, *messages],
        "max_completion_tokens": body.max_output_tokens, "temperature": body.temperature, "top_p": body.top_p,
        "user": body.user, "response_format": _response_format(body), "stream": body.stream,
        "logprobs": logprobs, "top_logprobs": (body.top_logprobs or 0) if logprobs else None,
        "truncate_prompt_tokens": -1 if body.truncation == "auto" else None,
    })


def _usage(plan: Plan, prompt_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {"input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": sum(plan.cached_tokens.values())},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + output_tokens}


def _text_part(text: str, logprobs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def _message(rid: str, status: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": f"msg_{rid}", "type": "message", "status": status, "role": "assistant", "content": content}


def _status(finish_reason: str | None) -> tuple[str, dict[str, str] | None]:
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    return "completed", None


def _body(rid: str, created: int, request: ResponsesRequest, settings: Settings, *, status: str,
          output: list[dict[str, Any]], usage: dict[str, Any] | None,
          incomplete: dict[str, str] | None = None) -> dict[str, Any]:
    fmt = request.text.format if request.text is not None and request.text.format is not None else None
    return {
        "id": f"resp_{rid}", "object": "response", "created_at": created, "status": status, "error": None,
        "incomplete_details": incomplete, "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens, "model": settings.model_name, "output": output,
        "parallel_tool_calls": request.parallel_tool_calls is not False,
        "previous_response_id": request.previous_response_id, "reasoning": {"effort": None, "summary": None},
        "store": request.store, "temperature": request.temperature, "top_p": request.top_p,
        "top_logprobs": request.top_logprobs,
        "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}},
        "tool_choice": request.tool_choice or "auto", "tools": [], "truncation": request.truncation or "disabled",
        "usage": usage, "user": request.user, "metadata": request.metadata or {}, "background": False,
        "service_tier": request.service_tier or "default",
    }


@router.post("/responses", response_model=None)
async def create_response(body: ResponsesRequest, request: Request, settings: Settings = Depends(get_settings),
                          engines: EngineManager = Depends(get_engines)) -> JSONResponse | StreamingResponse:
    _refuse(body)
    history: list[dict[str, Any]] = []
    if body.previous_response_id is not None:
        previous = _store(request).get(body.previous_response_id)
        if previous is None:
            raise APIError(400, f"Previous response with id '{body.previous_response_id}' not found (responses "
                                "are kept in this server's memory, the oldest dropped past stored_responses_bytes)",
                           param="previous_response_id", code="previous_response_not_found")
        history = previous.messages
    messages = _input_messages(body)
    names = _Names(bool(body.instructions), len(_instructions(body)) + len(history))
    try:
        return await _answer(body, request, settings, engines, history, messages, names)
    except APIError as error:
        raise names.error(error) from None


@dataclass
class _Answer:
    """One response being answered: what it renders and what it keeps once its text is whole."""

    body: ResponsesRequest
    plan: Plan
    rid: str
    created: int
    settings: Settings
    gateway: Gateway
    conversation: list[dict[str, Any]]
    """The messages before the reply: the earlier conversation and this input (no instructions)."""

    def response(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None = None,
                 incomplete: dict[str, str] | None = None) -> dict[str, Any]:
        return _body(self.rid, self.created, self.body, self.settings, status=status, output=output, usage=usage,
                     incomplete=incomplete)

    def finish(self, choice: Choice) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """The finished text part, message and response; the response is stored (``store``) and its
        tokens counted, the same for a stream and a whole reply."""
        status, incomplete = _status(choice.finish_reason)
        part = _text_part(choice.text, choice.logprobs if self.plan.top_logprobs is not None else [])
        item = _message(self.rid, status, [part])
        prompt_tokens = len(self.plan.prompts[0])
        response = self.response(status, [item], _usage(self.plan, prompt_tokens, choice.tokens), incomplete)
        if self.body.store:
            self.gateway.responses.put(response["id"], Stored(
                [*self.conversation, {"role": "assistant", "content": choice.text}], response))
        self.gateway.metrics.completion_tokens.labels("responses").inc(choice.tokens)
        return part, item, response


async def _answer(body: ResponsesRequest, request: Request, settings: Settings, engines: EngineManager,
                  history: list[dict[str, Any]], messages: list[dict[str, Any]], names: _Names
                  ) -> JSONResponse | StreamingResponse:
    """Run the chat completion the request amounts to; its errors are named in chat's words."""
    plan = await chat_plan(_chat_request(body, history, messages), request, settings, engines)
    assert isinstance(plan, Plan)  # a chat request built here never asks for a beam search
    gateway = get_gateway(request)
    rid = request_id(request)
    answer = _Answer(body, plan, rid, int(time.time()), settings, gateway, [*history, *messages])
    gateway.metrics.prompt_tokens.labels("responses").inc(len(plan.prompts[0]))
    if body.stream:
        outputs = await primed(request, merge(engine_streams(engines, plan, rid)))
        numbers = _Numbering(names)
        return StreamingResponse(guarded(_events(answer, outputs, numbers), done=False, event="error",
                                         shape=numbers.error),
                                 media_type="text/event-stream", headers=SSE_HEADERS)
    choices = await until_disconnect(request, lambda: run_plan(engines, plan, rid))
    return JSONResponse(answer.finish(choices.get(0, Choice()))[2])


class _Numbering:
    """A stream's ``sequence_number``s, shared by its events and the error event ``guarded`` sends."""

    def __init__(self, names: _Names) -> None:
        self.next = 0
        self.names = names

    def take(self) -> int:
        self.next += 1
        return self.next - 1

    def error(self, payload: dict[str, Any]) -> dict[str, Any]:
        """OpenAI's error event of a Responses stream, from the error ``guarded`` would send."""
        error = payload["error"]
        return {"type": "error", "sequence_number": self.take(), "code": error["code"],
                "message": self.names.message(error["message"]), "param": self.names.param(error["param"])}


async def _events(answer: _Answer, outputs: AsyncIterator[tuple[int, Any]], numbers: _Numbering
                  ) -> AsyncGenerator[bytes, None]:
    """The Responses API's stream: the response created and in progress, its message and text part
    added, the text in deltas, then each done, then the response completed (or incomplete)."""

    def event(kind: str, **fields: Any) -> bytes:
        return sse_event(kind, {"type": kind, "sequence_number": numbers.take(), **fields})

    plan = answer.plan
    place = {"item_id": f"msg_{answer.rid}", "output_index": 0, "content_index": 0}
    head = answer.response("in_progress", [])
    yield event("response.created", response=head)
    yield event("response.in_progress", response=head)
    yield event("response.output_item.added", output_index=0, item=_message(answer.rid, "in_progress", []))
    yield event("response.content_part.added", part=_text_part("", []), **place)
    choice = Choice()
    try:
        async for _, output in outputs:
            plan.observe(0, output)
            for delta in output.completions:
                plan.check_failed(delta)
                before = len(choice.logprobs)
                choice.add(delta, plan.top_logprobs, "chat", plan.tokens)
                logprobs = choice.logprobs[before:] if plan.top_logprobs is not None else []
                if delta.text or logprobs:
                    yield event("response.output_text.delta", delta=delta.text, logprobs=logprobs, **place)
    finally:  # a client that left: closing the engine streams aborts them
        if isinstance(outputs, AsyncGenerator):
            await outputs.aclose()
    part, item, response = answer.finish(choice)
    yield event("response.output_text.done", text=choice.text, logprobs=part["logprobs"], **place)
    yield event("response.content_part.done", part=part, **place)
    yield event("response.output_item.done", output_index=0, item=item)
    yield event("response.completed" if response["status"] == "completed" else "response.incomplete",
                response=response)


@router.get("/responses/{response_id}")
async def retrieve_response(response_id: str, request: Request) -> dict[str, Any]:
    stored = _store(request).get(response_id)
    if stored is None:
        raise APIError(404, f"No response found with id '{response_id}'", param="response_id", code="not_found")
    return stored.body


@router.delete("/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> dict[str, Any]:
    if not _store(request).delete(response_id):
        raise APIError(404, f"No response found with id '{response_id}'", param="response_id", code="not_found")
    return {"id": response_id, "object": "response.deleted", "deleted": True}
