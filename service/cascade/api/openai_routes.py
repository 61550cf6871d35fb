"""``/v1/models``, ``/v1/completions`` and ``/v1/chat/completions``: translate, run, stream."""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse

from cascade.api.deps import get_engines, get_metrics, get_settings, request_id
from cascade.api.errors import APIError
from cascade.api.input_bounds import check_fits, check_words
from cascade.api.input_bounds import tokenize as tokenize_text
from cascade.api.openai_protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CodecField,
    CompletionRequest,
    SamplingFields,
    TokenizeRequest,
)
from cascade.api.predictions import PredictionUsage, prediction_args
from cascade.api.sampling import (
    check_model,
    resolve_max_tokens,
    sampling_params,
    unsupported_fields,
)
from cascade.api.streaming import SSE_DONE, SSE_HEADERS, error_payload, merge, primed, sse_data, until_disconnect
from cascade.api.structured import structured_outputs
from cascade.api.topk_export import export_completion
from cascade.codec.pipeline import CodecPipeline, CodecUnavailableError
from cascade.codec.sampling_codec import SamplingEncoder
from cascade.engine.config import EngineRole
from cascade.engine.manager import EngineManager
from cascade.metrics import Metrics
from cascade.settings import Settings

if TYPE_CHECKING:
    from vllm import RequestOutput, SamplingParams

router = APIRouter(prefix="/v1", tags=["openai"])
Kind = Literal["chat", "completion"]


@dataclass
class Choice:
    """One choice being assembled from engine deltas."""

    text: str = ""
    tokens: int = 0
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass
class Plan:
    """What to run: prompts (token ids), engine role and parameters, and how to report it."""

    kind: Kind
    prompts: list[list[int]]
    params: SamplingParams
    n: int
    stream: bool
    include_usage: bool
    top_logprobs: int | None
    role: EngineRole = EngineRole.MAIN
    predictions: PredictionUsage = field(default_factory=PredictionUsage)
    codec: SamplingEncoder | None = None
    continuous_usage: bool = False
    cached_tokens: dict[int, int] = field(default_factory=dict)

    def observe_prompt(self, prompt_index: int, output: RequestOutput) -> None:
        """Remember how many prompt tokens the engine's prefix cache served (vLLM reports it per prompt)."""
        if output.num_cached_tokens is not None:
            self.cached_tokens[prompt_index] = output.num_cached_tokens

    def observe(self, completion: Any) -> list[str]:
        """Collect per-sequence statistics; returns codec chunks that became final (encode mode)."""
        self.predictions.add(getattr(completion, "spec_decode_metrics", None))
        return self.codec.observe(completion) if self.codec is not None else []


def _top_entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def _logprob_entries(completion: Any, top_n: int | None, kind: Kind) -> list[dict[str, Any]]:
    """OpenAI per-token entries; vLLM's dict holds the top ``top_n`` plus the sampled token.

    Chat's ``top_logprobs`` are the ``top_n`` best; completions' also hold the sampled token
    (OpenAI's legacy rule, so ``logprobs: 0`` still shows it)."""
    if top_n is None or completion.logprobs is None:
        return []
    entries = []
    for token_id, logprobs in zip(completion.token_ids, completion.logprobs, strict=False):
        chosen = logprobs[token_id]
        ranked = sorted(logprobs.items(), key=lambda item: -item[1].logprob)
        best = [lp for tid, lp in ranked[:top_n] if kind == "chat" or tid != token_id]
        if kind == "completion":
            best = sorted([*best, chosen], key=lambda lp: -lp.logprob)
        entry = _top_entry(chosen.decoded_token or "", chosen.logprob)
        entry["top_logprobs"] = [_top_entry(lp.decoded_token or "", lp.logprob) for lp in best]
        entries.append(entry)
    return entries


def _render_logprobs(kind: Kind, entries: list[dict[str, Any]], text_offset: int) -> dict[str, Any]:
    if kind == "chat":
        return {"content": entries}
    offsets, pos = [], text_offset
    for entry in entries:
        offsets.append(pos)
        pos += len(entry["token"])
    return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
            "text_offset": offsets}


def _usage(prompt_tokens: int, completion_tokens: int, plan: Plan) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": sum(plan.cached_tokens.values())},
            "completion_tokens_details": plan.predictions.details()}


def _engine_streams(engines: EngineManager, plan: Plan, rid: str) -> list[AsyncIterator[RequestOutput]]:
    return [engines.generate(prompt, plan.params, f"{rid}-{i}", plan.role) for i, prompt in enumerate(plan.prompts)]


async def _run(engines: EngineManager, plan: Plan, rid: str) -> dict[int, Choice]:
    choices: dict[int, Choice] = {}
    async for prompt_index, output in merge(_engine_streams(engines, plan, rid)):
        plan.observe_prompt(prompt_index, output)
        for completion in output.outputs:
            choice = choices.setdefault(prompt_index * plan.n + completion.index, Choice())
            choice.text += completion.text
            choice.tokens += len(completion.token_ids)
            choice.logprobs += _logprob_entries(completion, plan.top_logprobs, plan.kind)
            choice.finish_reason = completion.finish_reason or choice.finish_reason
            plan.observe(completion)
    return choices


def _count_predictions(metrics: Metrics, plan: Plan) -> None:
    metrics.accepted_prediction_tokens.inc(plan.predictions.accepted)
    metrics.rejected_prediction_tokens.inc(plan.predictions.rejected)


def _envelope(kind: Kind, rid: str, model: str, chunk: bool) -> dict[str, Any]:
    prefix = "chatcmpl" if kind == "chat" else "cmpl"
    obj = {"chat": "chat.completion", "completion": "text_completion"}[kind]
    if chunk and kind == "chat":
        obj += ".chunk"
    return {"id": f"{prefix}-{rid}", "object": obj, "created": int(time.time()), "model": model}


async def _respond(request: Request, plan: Plan, settings: Settings, engines: EngineManager,
                   metrics: Metrics) -> JSONResponse | StreamingResponse:
    rid = request_id(request)
    prompt_tokens = sum(len(p) for p in plan.prompts)
    metrics.prompt_tokens.labels(plan.kind).inc(prompt_tokens)
    started = time.monotonic()
    if plan.stream:
        outputs = await primed(request, merge(_engine_streams(engines, plan, rid)))
        return StreamingResponse(_stream(plan, outputs, rid, started, settings, engines, metrics, prompt_tokens),
                                 media_type="text/event-stream", headers=SSE_HEADERS)
    choices = await until_disconnect(request, lambda: _run(engines, plan, rid))
    metrics.ttft.labels(plan.kind).observe(time.monotonic() - started)
    completion_tokens = sum(c.tokens for c in choices.values())
    metrics.completion_tokens.labels(plan.kind).inc(completion_tokens)
    _count_predictions(metrics, plan)
    body = _envelope(plan.kind, rid, settings.model_name, chunk=False)
    rendered = []
    for index in sorted(choices):
        choice = choices[index]
        logprobs = _render_logprobs(plan.kind, choice.logprobs, 0) if plan.top_logprobs is not None else None
        if plan.kind == "chat":
            rendered.append({"index": index, "message": {"role": "assistant", "content": choice.text},
                             "logprobs": logprobs, "finish_reason": choice.finish_reason})
        else:
            rendered.append({"index": index, "text": choice.text, "logprobs": logprobs,
                             "finish_reason": choice.finish_reason})
    body["choices"] = rendered
    body["usage"] = _usage(prompt_tokens, completion_tokens, plan)
    if plan.codec is not None:
        await until_disconnect(request, plan.codec.finish)
        body["codec"] = plan.codec.summary()
    return JSONResponse(body)


async def _stream(plan: Plan, outputs: AsyncIterator[tuple[int, RequestOutput]], rid: str, started: float,
                  settings: Settings, engines: EngineManager, metrics: Metrics,
                  prompt_tokens: int) -> AsyncIterator[bytes]:
    first = True
    completion_tokens = 0
    text_offsets: dict[int, int] = {}
    announced: set[int] = set()
    try:
        async for prompt_index, output in outputs:
            plan.observe_prompt(prompt_index, output)
            for completion in output.outputs:
                index = prompt_index * plan.n + completion.index
                if first:
                    metrics.ttft.labels(plan.kind).observe(time.monotonic() - started)
                    first = False
                completion_tokens += len(completion.token_ids)
                codec_chunks = plan.observe(completion)
                metrics.completion_tokens.labels(plan.kind).inc(len(completion.token_ids))
                entries = _logprob_entries(completion, plan.top_logprobs, plan.kind)
                logprobs = None
                if plan.top_logprobs is not None:
                    logprobs = _render_logprobs(plan.kind, entries, text_offsets.get(index, 0))
                text_offsets[index] = text_offsets.get(index, 0) + len(completion.text)
                chunk = _envelope(plan.kind, rid, settings.model_name, chunk=True)
                if plan.kind == "chat":
                    delta: dict[str, Any] = {"content": completion.text}
                    if index not in announced:
                        announced.add(index)
                        delta["role"] = "assistant"
                    body = {"index": index, "delta": delta, "logprobs": logprobs,
                            "finish_reason": completion.finish_reason}
                else:
                    body = {"index": index, "text": completion.text, "logprobs": logprobs,
                            "finish_reason": completion.finish_reason}
                chunk["choices"] = [body]
                if plan.codec is not None:
                    if completion.finish_reason is not None:
                        codec_chunks += await plan.codec.finish()
                        chunk["codec"] = plan.codec.summary()
                    chunk["codec_chunks"] = codec_chunks
                if plan.include_usage:
                    chunk["usage"] = _usage(prompt_tokens, completion_tokens, plan) if plan.continuous_usage else None
                yield sse_data(chunk)
        _count_predictions(metrics, plan)
        if plan.include_usage:
            chunk = _envelope(plan.kind, rid, settings.model_name, chunk=True)
            chunk["choices"] = []
            chunk["usage"] = _usage(prompt_tokens, completion_tokens, plan)
            yield sse_data(chunk)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        yield sse_data(error_payload(exc))
    yield SSE_DONE


def _check_token_ids(ids: list[int], vocab_size: int) -> list[int]:
    if not ids:
        raise APIError(400, "prompt must not be empty", param="prompt")
    if any(not 0 <= t < vocab_size for t in ids):
        raise APIError(400, f"prompt token ids must be in 0..{vocab_size - 1}", param="prompt")
    return ids


async def _prompt_ids(engines: EngineManager, text: str, max_len: int) -> list[int]:
    check_fits(len(text), max_len, engines.tokenizer, "prompt")
    return _check_token_ids(await tokenize_text(engines.tokenizer, text), len(engines.tokenizer))


async def completion_prompts(engines: EngineManager, value: str | list[Any], max_len: int) -> list[list[int]]:
    """Every accepted prompt form (text, texts, ids, lists of ids) as token id lists; text that cannot
    fit in ``max_len`` tokens is refused before it is tokenised."""
    vocab = len(engines.tokenizer)
    if isinstance(value, str):
        return [await _prompt_ids(engines, value, max_len)]
    if not value:
        raise APIError(400, "prompt must not be empty", param="prompt")
    if all(isinstance(v, int) for v in value):
        return [_check_token_ids(list(value), vocab)]
    if len(value) > 64:
        raise APIError(400, "at most 64 prompts per request", param="prompt")
    out = []
    for item in value:
        out.append(await _prompt_ids(engines, item, max_len) if isinstance(item, str)
                   else _check_token_ids(list(item), vocab))
    return out


def _template_messages(tokenizer: Any, chat: list[ChatMessage]) -> list[dict[str, str]]:
    """Messages for the chat template; a ``name`` goes to the template when the template reads
    names, and is refused otherwise (dropping it would silently change the conversation)."""
    reads_names = "name" in str(getattr(tokenizer, "chat_template", None) or "")
    messages = []
    for i, message in enumerate(chat):
        if (media := message.media()) is not None:
            raise APIError(400, f"{media} content parts are not supported: this model reads text only",
                           param=f"messages.{i}.content", code="unsupported_content")
        rendered = {"role": message.role, "content": message.text()}
        if message.name is not None:
            if not reads_names:
                raise APIError(400, "message names are not supported: this model's chat template does not use "
                                    "them", param=f"messages.{i}.name", code="unsupported_parameter")
            rendered["name"] = message.name
        messages.append(rendered)
    return messages


async def chat_prompt_from_messages(engines: EngineManager, chat: list[ChatMessage], max_len: int) -> list[int]:
    """Render messages with the model's chat template, then tokenise (refused first when the
    messages alone cannot fit in ``max_len`` tokens)."""
    messages = _template_messages(engines.tokenizer, chat)
    check_fits(sum(len(m["content"]) for m in messages), max_len, engines.tokenizer, "messages")
    try:
        text = engines.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as exc:
        raise APIError(400, f"messages could not be rendered with the model's chat template: {exc}",
                       param="messages") from None
    return _check_token_ids(await tokenize_text(engines.tokenizer, str(text)), len(engines.tokenizer))


def _continuous_usage(request: SamplingFields) -> bool:
    """``stream_options.continuous_usage_stats`` (vLLM's extension): every chunk carries the usage
    so far, and the final usage chunk follows as with ``include_usage``."""
    options = request.stream_options
    return bool(request.stream and options and options.continuous_usage_stats)


def _stream_flags(request: SamplingFields) -> tuple[bool, bool]:
    options = request.stream_options
    include_usage = bool(request.stream and options and (options.include_usage or options.continuous_usage_stats))
    return request.stream, include_usage


def _model_card(settings: Settings, engines: EngineManager) -> dict[str, Any]:
    return {"id": settings.model_name, "object": "model", "created": int(engines.started_at), "owned_by": "cascade",
            "max_model_len": settings.max_model_len}


@router.get("/models")
async def list_models(settings: Settings = Depends(get_settings),
                      engines: EngineManager = Depends(get_engines)) -> dict[str, Any]:
    return {"object": "list", "data": [_model_card(settings, engines)]}


@router.get("/models/{model:path}")
async def retrieve_model(model: str, settings: Settings = Depends(get_settings),
                         engines: EngineManager = Depends(get_engines)) -> dict[str, Any]:
    """The SDK's ``models.retrieve``; an id this service does not serve is OpenAI's 404."""
    check_model(model, settings)
    return _model_card(settings, engines)


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, settings: Settings = Depends(get_settings),
                   engines: EngineManager = Depends(get_engines)) -> dict[str, Any]:
    check_model(body.model, settings)
    engines.engine()
    if len(body.prompt) > settings.max_tokenize_chars:
        raise APIError(400, f"prompt may be at most {settings.max_tokenize_chars} characters (max_tokenize_chars); "
                            "split longer text", param="prompt")
    ids = await tokenize_text(engines.tokenizer, body.prompt, body.add_special_tokens)
    return {"tokens": ids, "count": len(ids), "max_model_len": settings.max_model_len}


@router.post("/completions", response_model=None)
async def completions(body: CompletionRequest, request: Request, settings: Settings = Depends(get_settings),
                      engines: EngineManager = Depends(get_engines),
                      metrics: Metrics = Depends(get_metrics)) -> JSONResponse | StreamingResponse:
    check_model(body.model, settings)
    unsupported_fields(body)
    check_words(body, settings)
    engines.engine()
    prompts = await completion_prompts(engines, body.prompt, settings.max_model_len)
    if body.compression:
        return await export_completion(request, body, prompts, settings, engines, metrics)
    if body.max_tokens == 0:
        raise APIError(400, "max_tokens must be at least 1", param="max_tokens")
    max_tokens = max(resolve_max_tokens(body.max_tokens, len(p), settings, "max_tokens") for p in prompts)
    stream, include_usage = _stream_flags(body)
    extra = await prediction_args(body, engines, settings)
    if extra is not None and len(prompts) > 1:
        raise APIError(400, "prediction is supported with a single prompt only", param="prompt")
    if body.codec is not None:
        return await _codec_completion(request, body, prompts, settings, engines, metrics)
    params = sampling_params(body, max_tokens=max_tokens, logprobs=body.logprobs, settings=settings,
                             vocab_size=len(engines.tokenizer), stream=stream, extra_args=extra)
    plan = Plan("completion", prompts, params, body.n, stream, include_usage, body.logprobs,
                role=EngineRole.PREDICT if extra else EngineRole.MAIN, continuous_usage=_continuous_usage(body))
    return await _respond(request, plan, settings, engines, metrics)


def _codec_for(request: Request) -> CodecPipeline:
    codec: CodecPipeline = request.app.state.codec
    try:
        codec.check_available()
    except CodecUnavailableError as exc:
        raise APIError(503, str(exc), code="codec_unavailable", headers={"Retry-After": "10"}) from None
    return codec


async def _codec_completion(request: Request, body: CompletionRequest, prompts: list[list[int]],
                            settings: Settings, engines: EngineManager,
                            metrics: Metrics) -> JSONResponse | StreamingResponse:
    """``codec: {"mode": "encode"}`` codes the sampled tokens; ``"decode"`` replays them from the code."""
    codec_field = body.codec
    assert codec_field is not None
    if not settings.enable_codec:
        raise APIError(400, "the codec is disabled on this server", param="codec")
    if body.prediction is not None or body.n != 1 or len(prompts) != 1 or body.logprobs is not None:
        raise APIError(400, "codec needs a single prompt, n=1, and no prediction or logprobs", param="codec")
    codec = _codec_for(request)
    vocab = codec.vocab_size
    if codec_field.top_k >= vocab:
        raise APIError(400, f"codec.top_k must be below the vocabulary size {vocab}", param="codec.top_k")
    stream, include_usage = _stream_flags(body)
    if codec_field.mode == "encode":
        if codec_field.data is not None:
            raise APIError(400, "codec.data is only for mode 'decode'", param="codec.data")
        if codec_field.token_ids is not None:
            return await _forced_encode(request, codec_field, prompts[0], stream, settings, codec)
        max_tokens = resolve_max_tokens(body.max_tokens, len(prompts[0]), settings, "max_tokens")
        params = sampling_params(body, max_tokens=max_tokens, logprobs=None, settings=settings,
                                 vocab_size=len(engines.tokenizer), stream=stream)
        encoder = SamplingEncoder(codec, prompts[0], codec_field.top_k, codec_field.precision_bits)
        plan = Plan("completion", prompts, params, 1, stream, include_usage, None, codec=encoder)
        return await _respond(request, plan, settings, engines, metrics)
    if codec_field.data is None:
        raise APIError(400, "codec mode 'decode' needs codec.data (base64)", param="codec.data")
    if codec_field.numerics is not None and codec_field.numerics != codec.numerics:
        raise APIError(409, f"codec.data was made with numerics {codec_field.numerics!r}; this server computes "
                            f"{codec.numerics!r}", param="codec.numerics", code="numerics_mismatch")
    try:
        payload = base64.b64decode(codec_field.data, validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, "codec.data is not valid base64", param="codec.data", code="invalid_base64") from None
    tokens = codec_field.tokens or body.max_tokens
    if tokens is None:
        raise APIError(400, "codec mode 'decode' needs codec.tokens", param="codec.tokens")
    resolve_max_tokens(tokens, len(prompts[0]), settings, "codec.tokens")
    ids = await until_disconnect(request, lambda: codec.decode_tokens_from(
        prompts[0], payload, tokens, tokens, codec_field.top_k, codec_field.precision_bits))
    summary = {"mode": "decode", "tokens": len(ids), "token_ids": ids}
    return _replayed(request, ids, len(prompts[0]), summary, stream, include_usage, settings, codec)


def _replayed(request: Request, ids: list[int], prompt_tokens: int, summary: dict[str, Any], stream: bool,
              include_usage: bool, settings: Settings, codec: CodecPipeline) -> JSONResponse | StreamingResponse:
    """A completion whose tokens the codec produced (no engine sampled them)."""
    rid = request_id(request)
    text = codec.decode_tokens(ids)
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(ids), "total_tokens": prompt_tokens + len(ids)}
    if not stream:
        body = _envelope("completion", rid, settings.model_name, chunk=False)
        body["choices"] = [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}]
        body["usage"] = usage
        body["codec"] = summary
        return JSONResponse(body)

    async def events() -> AsyncIterator[bytes]:
        chunk = _envelope("completion", rid, settings.model_name, chunk=True)
        chunk["choices"] = [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}]
        chunk["codec"] = summary
        if include_usage:
            chunk["usage"] = None
        yield sse_data(chunk)
        if include_usage:
            final = _envelope("completion", rid, settings.model_name, chunk=True)
            final["choices"] = []
            final["usage"] = usage
            yield sse_data(final)
        yield SSE_DONE

    return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)


async def _forced_encode(request: Request, codec_field: CodecField, prompt: list[int], stream: bool,
                         settings: Settings, codec: CodecPipeline) -> JSONResponse:
    """``codec: {"mode": "encode", "token_ids": [...]}``: code given tokens after the prompt (teacher
    forcing) instead of sampling — the inverse of decode mode, token for token."""
    if stream:
        raise APIError(400, "codec encode with token_ids is not streamed", param="stream")
    ids = codec_field.token_ids or []
    vocab = codec.vocab_size
    if any(not 0 <= t < vocab for t in ids):
        raise APIError(400, f"codec.token_ids must be in 0..{vocab - 1}", param="codec.token_ids")
    resolve_max_tokens(len(ids), len(prompt), settings, "codec.token_ids")
    rid = request_id(request)
    payload, _ = await until_disconnect(request, lambda: codec.encode_tokens(
        prompt, ids, len(ids), codec_field.top_k, codec_field.precision_bits))
    body = _envelope("completion", rid, settings.model_name, chunk=False)
    body["choices"] = [{"index": 0, "text": codec.decode_tokens(ids), "logprobs": None, "finish_reason": "length"}]
    body["usage"] = {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                     "total_tokens": len(prompt) + len(ids)}
    body["codec"] = {"mode": "encode", "tokens": len(ids), "top_k": codec_field.top_k,
                     "precision_bits": codec_field.precision_bits, "numerics": codec.numerics,
                     "data": base64.b64encode(payload).decode()}
    return JSONResponse(body)


@router.post("/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, request: Request,
                           settings: Settings = Depends(get_settings),
                           engines: EngineManager = Depends(get_engines),
                           metrics: Metrics = Depends(get_metrics)) -> JSONResponse | StreamingResponse:
    check_model(body.model, settings)
    unsupported_fields(body)
    check_words(body, settings)
    engines.engine()
    prompt = await chat_prompt_from_messages(engines, body.messages, settings.max_model_len)
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    max_tokens = resolve_max_tokens(body.max_completion_tokens or body.max_tokens, len(prompt), settings, param)
    top = (body.top_logprobs or 0) if body.logprobs else None
    if body.top_logprobs and not body.logprobs:
        raise APIError(400, "top_logprobs requires logprobs=true", param="top_logprobs")
    stream, include_usage = _stream_flags(body)
    extra = await prediction_args(body, engines, settings)
    params = sampling_params(body, max_tokens=max_tokens, logprobs=top, settings=settings,
                             vocab_size=len(engines.tokenizer), stream=stream, extra_args=extra,
                             structured=structured_outputs(body))
    plan = Plan("chat", [prompt], params, body.n, stream, include_usage, top,
                role=EngineRole.PREDICT if extra else EngineRole.MAIN, continuous_usage=_continuous_usage(body))
    return await _respond(request, plan, settings, engines, metrics)
