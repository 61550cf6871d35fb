"""``POST /v1/kcbs``: top-k-constrained beam search with probability lower bounds."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ConfigDict, Field, model_validator

from cascade.api.deps import get_gateway, request_id
from cascade.api.errors import APIError
from cascade.api.input_bounds import check_fits, tokenize
from cascade.api.openai_protocol import ChatMessage, StrictModel
from cascade.api.prompts import chat_prompt_from_messages, completion_prompts
from cascade.api.sampling import check_model, check_token_ids
from cascade.api.streaming import SSE_HEADERS, guarded, sse_data, until_disconnect
from cascade.engine.manager import EngineManager
from cascade.kcbs import KcbsSearch, KcbsSequence, match_target
from cascade.kcbs.algorithm import MAX_BEAM_WIDTH
from cascade.kcbs.driver import run_search
from cascade.lifecycle import Gateway
from cascade.settings import Settings

router = APIRouter(prefix="/v1", tags=["kcbs"])


class KcbsRequest(StrictModel):
    """Strict types: ``"2"`` or ``true`` for a number, ``"yes"`` for a flag are 400s, not coerced."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    prompt: str | list[int] | None = None
    messages: list[ChatMessage] | None = None
    beam_width: Annotated[int, Field(ge=1, le=MAX_BEAM_WIDTH)]
    steps: Annotated[int, Field(ge=1)]
    final_prune: bool = True
    eos: Literal["block", "stop"] = "block"
    temperature: Annotated[float, Field(ge=0.01, le=10.0)] = 1.0  # lower, logprob / temperature overflows
    target: str | list[int] | None = None
    max_edit_distance: Annotated[int, Field(ge=0)] = 0
    include_token_ids: bool = True
    stream: bool = False

    @model_validator(mode="after")
    def _one_prompt(self) -> KcbsRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of 'prompt' or 'messages'")
        return self


def _text(seq: KcbsSequence, tokenizer: Any) -> str:
    """The sequence's text as chat/completions show it: special tokens (EOS under "stop") left out."""
    return str(tokenizer.decode(list(seq.token_ids), skip_special_tokens=True))


def _sequence(seq: KcbsSequence, tokenizer: Any, include_ids: bool) -> dict[str, Any]:
    model_probability = math.exp(seq.model_logprob) if seq.model_logprob is not None else None
    out: dict[str, Any] = {"text": _text(seq, tokenizer), "score": seq.score,
                           "probability": seq.probability, "model_logprob": seq.model_logprob,
                           "model_probability": model_probability, "finish_reason": seq.finish_reason}
    if include_ids:
        out["token_ids"] = list(seq.token_ids)
    return out


async def _target_ids(body: KcbsRequest, engines: EngineManager) -> list[int] | None:
    if body.target is None:
        return None
    if isinstance(body.target, list):
        return list(check_token_ids(body.target, len(engines.tokenizer), "target", "target token ids"))
    check_fits(len(body.target), body.steps + body.max_edit_distance, engines.tokenizer, "target",
               "a match (steps + max_edit_distance)")
    return await tokenize(engines.tokenizer, body.target)


def _result(body: KcbsRequest, search: KcbsSearch, rid: str, settings: Settings, engines: EngineManager,
            prompt_len: int, target: list[int] | None) -> dict[str, Any]:
    result = search.result()
    tokenizer = engines.tokenizer
    payload: dict[str, Any] = {
        "id": f"kcbs-{rid}", "object": "kcbs.result", "model": settings.model_name,
        "sequences": [_sequence(s, tokenizer, body.include_token_ids) for s in result.sequences],
        "captured_probability": result.captured_probability,
        "usage": {"prompt_tokens": prompt_len, "steps": result.steps, "rows_evaluated": result.rows_evaluated},
    }
    if target is not None:
        same_text = [_text(s, tokenizer) == body.target for s in result.sequences] \
            if isinstance(body.target, str) else None
        match = match_target(result, target, body.max_edit_distance, same_text)
        payload["target_match"] = {"exact": match.exact, "near_verbatim_probability":
                                   match.near_verbatim_probability, "matches": match.matches}
    return payload


@router.post("/kcbs", response_model=None)
async def kcbs(body: KcbsRequest, request: Request,
               gateway: Gateway = Depends(get_gateway)) -> JSONResponse | StreamingResponse:
    settings, engines, metrics = gateway.settings, gateway.engines, gateway.metrics
    check_model(body.model, settings)
    engines.check_ready()
    if body.prompt is not None:
        prompt = (await completion_prompts(engines, body.prompt, settings.max_model_len, settings.max_prompts))[0]
    else:
        assert body.messages is not None
        prompt = await chat_prompt_from_messages(engines, body.messages, settings.max_model_len)
    room = settings.max_model_len - len(prompt)
    if room < 1:
        raise APIError(400, f"prompt has {len(prompt)} tokens; the context is {settings.max_model_len}",
                       param="prompt" if body.prompt is not None else "messages", code="context_length_exceeded")
    if body.steps > min(room, settings.max_kcbs_steps):  # the message names the limit that binds
        if room < settings.max_kcbs_steps:
            raise APIError(400, f"steps may be at most {room} for this prompt (max_model_len − prompt tokens)",
                           param="steps", code="context_length_exceeded")
        raise APIError(400, f"steps may be at most {settings.max_kcbs_steps} (max_kcbs_steps)", param="steps")
    if body.beam_width ** 2 > settings.max_kcbs_candidates:
        raise APIError(400, f"beam_width² may be at most {settings.max_kcbs_candidates}", param="beam_width")
    if body.beam_width * body.steps > settings.max_kcbs_rows:
        raise APIError(400, f"beam_width × steps may be at most {settings.max_kcbs_rows} (max_kcbs_rows): the "
                            "engine evaluates that many rows", param="steps")
    if body.target is not None and body.max_edit_distance > body.steps:
        raise APIError(400, f"max_edit_distance may be at most steps ({body.steps})", param="max_edit_distance")
    target = await _target_ids(body, engines)
    if target is not None and len(target) > body.steps + body.max_edit_distance:
        raise APIError(400, f"target has {len(target)} tokens: a {body.steps}-token sequence is never within "
                            f"{body.max_edit_distance} edits of more than {body.steps + body.max_edit_distance}",
                       param="target")
    eos_ids = engines.eos_token_ids
    search = KcbsSearch(body.beam_width, body.steps, body.final_prune, eos_ids, body.eos)
    rid = request_id(request)
    metrics.prompt_tokens.labels("kcbs").inc(len(prompt))

    def steps() -> AsyncIterator[KcbsSearch]:
        return run_search(engines.top_logprobs, prompt, search, body.beam_width, eos_ids, body.temperature, rid,
                          gateway.live_searches)

    if body.stream:
        async def stream() -> AsyncIterator[bytes]:
            async for state in steps():
                metrics.kcbs_steps.inc()
                beams = [_sequence(s, engines.tokenizer, body.include_token_ids) for s in state.live_beams()]
                yield sse_data({"object": "kcbs.step", "step": state.step, "beams": beams})
            yield sse_data(_result(body, search, rid, settings, engines, len(prompt), target))

        return StreamingResponse(guarded(stream()), media_type="text/event-stream", headers=SSE_HEADERS)

    async def run() -> None:
        async for _ in steps():
            metrics.kcbs_steps.inc()

    await until_disconnect(request, run)
    payload = _result(body, search, rid, settings, engines, len(prompt), target)
    if not math.isfinite(payload["captured_probability"]):
        raise APIError(500, "k-CBS produced a non-finite probability")
    return JSONResponse(payload)
