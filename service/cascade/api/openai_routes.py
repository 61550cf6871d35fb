"""``/v1/models``, ``/v1/tokenize``, ``/v1/detokenize``, ``/v1/completions`` and ``/v1/chat/completions``
(vLLM's ``/tokenize`` and ``/detokenize`` too): validate, plan (``plans``), ask the engine adapter,
render (``completion_render``); prompts come from ``prompts``, the codec feature from
``codec_completions``, the top-k export from ``topk_export``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse

from cascade.api.beam_search import beam_search_reply
from cascade.api.codec_completions import codec_completion
from cascade.api.completion_render import (
    Choice,
    TokenCharacters,
    choice_body,
    continuous_usage,
    envelope,
    logprob_entries,
    render_logprobs,
    stream_flags,
)
from cascade.api.deps import get_engines, get_gateway, get_metrics, get_settings, reply_id, request_id
from cascade.api.errors import APIError
from cascade.api.input_bounds import tokenize as tokenize_text
from cascade.api.openai_protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from cascade.api.plans import Plan, admit, chat_plan, engine_streams, run_plan
from cascade.api.predictions import predicted
from cascade.api.prompts import chat_prompt_from_messages, completion_prompts, echo_texts, text_bound, truncated
from cascade.api.sampling import (
    check_min_tokens,
    check_model,
    check_scored_prompts,
    check_token_ids,
    generation_request,
    resolve_max_tokens,
    shown_alternatives,
)
from cascade.api.streaming import SSE_HEADERS, guarded, merge, primed, sse_data, until_disconnect
from cascade.api.structured import output_constraint
from cascade.api.topk_export import export_completion
from cascade.codec.pipeline import CodecPipeline
from cascade.codec.sampling_codec import SamplingEncoder
from cascade.engine.config import EngineRole
from cascade.engine.manager import EngineManager
from cascade.engine.types import Generation
from cascade.metrics import Metrics
from cascade.settings import Settings

router = APIRouter(prefix="/v1", tags=["openai"])
vllm_paths = APIRouter(tags=["vllm"])
"""vLLM serves ``/tokenize`` and ``/detokenize`` outside ``/v1``: the same handlers answer there."""


def _count_predictions(metrics: Metrics, plan: Plan) -> None:
    metrics.accepted_prediction_tokens.inc(plan.predictions.accepted)
    metrics.rejected_prediction_tokens.inc(plan.predictions.rejected)


async def _respond(request: Request, plan: Plan, settings: Settings, engines: EngineManager,
                   metrics: Metrics) -> JSONResponse | StreamingResponse:
    engines.validate(plan.request)
    rid = request_id(request)
    prompt_tokens = sum(len(p) for p in plan.prompts)
    metrics.prompt_tokens.labels(plan.kind).inc(prompt_tokens)
    started = time.monotonic()
    created = int(time.time())
    if plan.stream:
        outputs = await primed(request, merge(engine_streams(engines, plan, rid)))
        events = _stream(plan, outputs, reply_id(request), created, started, settings, metrics, prompt_tokens)
        return StreamingResponse(guarded(events), media_type="text/event-stream", headers=SSE_HEADERS)
    choices = await until_disconnect(request, lambda: run_plan(engines, plan, rid))
    metrics.ttft.labels(plan.kind).observe(time.monotonic() - started)
    completion_tokens = sum(c.tokens for c in choices.values())
    metrics.completion_tokens.labels(plan.kind).inc(completion_tokens)
    _count_predictions(metrics, plan)
    body = envelope(plan.kind, reply_id(request), settings.model_name, chunk=False, created=created)
    body["choices"] = [
        choice_body(plan.kind, index, choices[index].text,
                    render_logprobs(plan.kind, choices[index].logprobs, 0, choices[index].characters)
                    if plan.top_logprobs is not None else None,
                    choices[index].finish_reason, chunk=False, stop_reason=choices[index].stop_reason)
        | plan.choice_fields(index, choices[index].token_ids, first=True, nulls=True)
        for index in sorted(choices)]
    if plan.kind == "chat":
        body |= plan.prompt_fields(0, first=True, nulls=True)
    body["usage"] = plan.usage(prompt_tokens, completion_tokens)
    if plan.codec is not None:
        await until_disconnect(request, plan.codec.finish)
        body["codec"] = plan.codec.summary()
    return JSONResponse(body)


async def _stream(plan: Plan, outputs: AsyncIterator[tuple[int, Generation]], rid: str, created: int, started: float,
                  settings: Settings, metrics: Metrics, prompt_tokens: int) -> AsyncIterator[bytes]:
    first = True
    completion_tokens = 0
    text_offsets: dict[int, int] = {}
    counters: dict[int, TokenCharacters] = {}
    announced: set[int] = set()
    async for prompt_index, output in outputs:
        plan.observe(prompt_index, output)
        for delta in map(plan.shown, output.completions):
            plan.check_failed(delta)
            index = prompt_index * plan.request.n + delta.index
            if first:
                metrics.ttft.labels(plan.kind).observe(time.monotonic() - started)
                first = False
            completion_tokens += len(delta.token_ids)
            plan.observe_delta(delta)
            metrics.completion_tokens.labels(plan.kind).inc(len(delta.token_ids))
            start = plan.echoed(prompt_index) if index not in announced else Choice()
            text = start.text + delta.text
            logprobs = None
            if plan.top_logprobs is not None:
                entries = start.logprobs + logprob_entries(delta, plan.top_logprobs, plan.kind, plan.tokens,
                                                           plan.tokens_as_ids)
                counter = counters.setdefault(index, TokenCharacters(plan.tokens))
                characters = start.characters + counter.count(delta, plan.top_logprobs)
                logprobs = render_logprobs(plan.kind, entries, text_offsets.get(index, 0), characters)
                # by tokens' characters, not the chunk's text: a chunk may hold none of its token's characters
                text_offsets[index] = text_offsets.get(index, 0) + sum(characters)
            chunk = envelope(plan.kind, rid, settings.model_name, chunk=True, created=created)
            first_chunk = index not in announced
            chunk["choices"] = [choice_body(plan.kind, index, text, logprobs, delta.finish_reason, chunk=True,
                                            first=first_chunk, stop_reason=delta.stop_reason)
                                | plan.choice_fields(index, delta.token_ids, first_chunk)]
            if plan.kind == "chat":  # once, in the stream's first chunk
                chunk |= plan.prompt_fields(index, not announced)
            announced.add(index)
            if plan.codec is not None:
                codec_chunks: list[str] = []
                if delta.finish_reason is not None:
                    codec_chunks = await plan.codec.finish()
                    chunk["codec"] = plan.codec.summary()
                chunk["codec_chunks"] = codec_chunks
            if plan.include_usage:
                chunk["usage"] = plan.usage(prompt_tokens, completion_tokens) if plan.continuous_usage else None
            yield sse_data(chunk)
    _count_predictions(metrics, plan)
    if plan.include_usage:
        chunk = envelope(plan.kind, rid, settings.model_name, chunk=True, created=created)
        chunk["choices"] = []
        chunk["usage"] = plan.usage(prompt_tokens, completion_tokens)
        yield sse_data(chunk)


def _model_card(settings: Settings, engines: EngineManager) -> dict[str, Any]:
    """OpenAI's model object with vLLM's additions (``root``: what was loaded, ``parent``: the base model
    of an adapter, none here; ``permission``), which clients of vLLM read."""
    created = int(engines.started_at)
    root = Path(settings.model).name if Path(settings.model).is_absolute() else settings.model  # no server paths
    permission = {"id": f"modelperm-{settings.model_name}", "object": "model_permission", "created": created,
                  "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                  "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False, "organization": "*",
                  "group": None, "is_blocking": False}
    return {"id": settings.model_name, "object": "model", "created": created, "owned_by": "cascade",
            "root": root, "parent": None, "max_model_len": settings.max_model_len,
            "permission": [permission]}


@router.get("/models")
async def list_models(settings: Settings = Depends(get_settings),
                      engines: EngineManager = Depends(get_engines)) -> dict[str, Any]:
    return {"object": "list", "data": [_model_card(settings, engines)]}


@router.get("/models/{model:path}")
async def retrieve_model(model: str, settings: Settings = Depends(get_settings),
                         engines: EngineManager = Depends(get_engines)) -> dict[str, Any]:
    """The SDK's ``models.retrieve``; an id this service does not serve is OpenAI's 404. ``/models/``
    (no id: a trailing slash) is the list."""
    if not model:
        return await list_models(settings, engines)
    check_model(model, settings)
    return _model_card(settings, engines)


def _check_tokenizer_request(model: str, size: int, param: str, unit: str, settings: Settings,
                             engines: EngineManager) -> None:
    """What ``/tokenize`` and ``/detokenize`` check first: the model, a ready engine, and the work's
    size (``max_tokenize_chars``: both run the tokenizer in the gateway)."""
    check_model(model, settings)
    engines.check_ready()
    if size > settings.max_tokenize_chars:
        raise APIError(400, f"{param} may be at most {settings.max_tokenize_chars} {unit} (max_tokenize_chars); "
                            "split longer input", param=param)


@router.post("/tokenize")
@vllm_paths.post("/tokenize")
async def tokenize(body: TokenizeRequest, settings: Settings = Depends(get_settings),
                   engines: EngineManager = Depends(get_engines)) -> dict[str, Any]:
    param = "prompt" if body.prompt is not None else "messages"
    _check_tokenizer_request(body.model, body.size(), param, "characters", settings, engines)
    if body.messages is not None:
        ids = await chat_prompt_from_messages(engines, body.messages, settings.max_tokenize_chars,
                                              add_generation_prompt=body.add_generation_prompt,
                                              continue_final_message=body.continue_final_message,
                                              template_kwargs=body.chat_template_kwargs,
                                              add_special_tokens=body.add_special_tokens)
    else:
        ids = await tokenize_text(engines.tokenizer, body.prompt or "", body.add_special_tokens)
    strings = engines.tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
    return {"tokens": ids, "count": len(ids), "max_model_len": settings.max_model_len, "token_strs": strings}


@router.post("/detokenize")
@vllm_paths.post("/detokenize")
async def detokenize(body: DetokenizeRequest, settings: Settings = Depends(get_settings),
                     engines: EngineManager = Depends(get_engines)) -> dict[str, Any]:
    """The text of ``tokens`` as vLLM's ``/detokenize`` gives it (special tokens kept)."""
    _check_tokenizer_request(body.model, len(body.tokens), "tokens", "ids", settings, engines)
    ids = check_token_ids(body.tokens, len(engines.tokenizer), "tokens")
    text = await asyncio.to_thread(engines.tokenizer.decode, list(ids))
    return {"prompt": str(text)}


@router.post("/completions", response_model=None)
async def completions(body: CompletionRequest, request: Request, settings: Settings = Depends(get_settings),
                      engines: EngineManager = Depends(get_engines),
                      metrics: Metrics = Depends(get_metrics)) -> JSONResponse | StreamingResponse:
    admit(body, request, settings, engines)
    keep = body.truncate_prompt_tokens
    add_special_tokens = body.add_special_tokens if body.add_special_tokens is not None else body.codec is None
    texts = [body.prompt] if isinstance(body.prompt, str) else [p for p in body.prompt if isinstance(p, str)]
    sent = await completion_prompts(engines, body.prompt,
                                    text_bound(keep, settings.max_model_len, settings.max_tokenize_chars,
                                               sum(map(len, texts))),
                                    settings.max_prompts, add_special_tokens)
    prompts = truncated(sent, keep, settings.max_model_len, body.truncation_side, body.max_tokens)
    echo = echo_texts(body.prompt if prompts == sent else prompts, prompts, engines.tokenizer) if body.echo else None
    if body.use_beam_search:
        return await beam_search_reply(request, body, "completion", prompts, echo, get_gateway(request),
                                       body.logprobs)
    if body.compression:
        return await export_completion(request, body, prompts, settings, engines, metrics)
    score_only = body.echo and body.max_tokens == 0
    if body.max_tokens == 0 and not score_only:
        raise APIError(400, "max_tokens must be at least 1 (0 only with echo, to score the prompt)",
                       param="max_tokens")
    if score_only:
        if body.logprob_token_ids is not None:
            raise APIError(400, "logprob_token_ids need generated tokens: echo with max_tokens 0 generates none",
                           param="logprob_token_ids")
        check_min_tokens(body.min_tokens, 0)
        check_scored_prompts(prompts, settings)
        max_tokens = 1  # the engine samples one token past the prompt, which the reply leaves out
    else:
        max_tokens = max(resolve_max_tokens(body.max_tokens, len(p), settings, "max_tokens") for p in prompts)
    stream, include_usage = stream_flags(body)
    prediction = await predicted(body, engines, settings)
    if prediction is not None and len(prompts) > 1:
        raise APIError(400, "prediction is supported with a single prompt only", param="prompt")
    vocab = len(engines.tokenizer)
    if (codec_field := body.codec) is not None:
        async def sample_and_code(codec: CodecPipeline) -> JSONResponse | StreamingResponse:
            max_tokens = resolve_max_tokens(body.max_tokens, len(prompts[0]), settings, "max_tokens")
            sampling = generation_request(body, max_tokens=max_tokens, logprobs=None, settings=settings,
                                          vocab_size=vocab, stream=stream,
                                          constraint=await output_constraint(body, settings))
            encoder = SamplingEncoder(codec, prompts[0], codec_field.top_k, codec_field.precision_bits)
            return await _respond(request, Plan("completion", prompts, sampling, stream, include_usage, None,
                                                codec=encoder), settings, engines, metrics)

        return await codec_completion(request, body, prompts, settings, sample_and_code)
    echo_scores = body.logprobs if body.echo else None
    scores = max((k for k in (echo_scores, body.prompt_logprobs) if k is not None), default=None)
    sampling = generation_request(body, max_tokens=max_tokens, logprobs=body.logprobs, settings=settings,
                                  vocab_size=vocab, stream=stream, prediction=prediction,
                                  constraint=await output_constraint(body, settings), prompt_logprobs=scores)
    plan = Plan("completion", prompts, sampling, stream, include_usage, shown_alternatives(body, body.logprobs),
                role=EngineRole.PREDICT if prediction else EngineRole.MAIN, continuous_usage=continuous_usage(body),
                tokens=get_gateway(request).token_table() if body.logprobs is not None else None,
                echo=echo,
                score_only=score_only, prompt_logprobs=body.prompt_logprobs, return_token_ids=body.return_token_ids,
                tokens_as_ids=body.return_tokens_as_token_ids)
    return await _respond(request, plan, settings, engines, metrics)


@router.post("/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, request: Request,
                           settings: Settings = Depends(get_settings),
                           engines: EngineManager = Depends(get_engines),
                           metrics: Metrics = Depends(get_metrics)) -> JSONResponse | StreamingResponse:
    plan = await chat_plan(body, request, settings, engines)
    if isinstance(plan, JSONResponse):
        return plan
    return await _respond(request, plan, settings, engines, metrics)


# HEAD wherever a probe GETs (load balancers probe with HEAD); kept out of the schema, whose
# operation ids would otherwise depend on the order of a set of methods
router.add_api_route("/models", list_models, methods=["HEAD"], include_in_schema=False)
router.add_api_route("/models/{model:path}", retrieve_model, methods=["HEAD"], include_in_schema=False)
