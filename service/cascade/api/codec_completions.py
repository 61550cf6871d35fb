"""The codec on ``/v1/completions``: ``codec: {"mode": "encode"}`` codes the sampled (or given) tokens,
``"decode"`` replays them from the code."""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from cascade.api.completion_render import Sampled, choice_body, envelope, sampled_text, stream_flags, usage
from cascade.api.deps import get_gateway, reply_id
from cascade.api.errors import APIError
from cascade.api.openai_protocol import CompletionRequest
from cascade.api.sampling import check_token_ids, resolve_max_tokens
from cascade.api.streaming import SSE_DONE, SSE_HEADERS, sse_data, until_disconnect
from cascade.codec.pipeline import CodecPipeline, CodecUnavailableError
from cascade.codec.sampling_codec import (
    ReplayMismatchError,
    check_canonical,
    check_identity,
    check_tokens,
    replay_check,
)
from cascade.settings import Settings

Sample = Callable[[CodecPipeline], Awaitable[JSONResponse | StreamingResponse]]


def codec_for(request: Request) -> CodecPipeline:
    """The ready codec, or the 503 that says why not."""
    try:
        return get_gateway(request).ready_codec()
    except CodecUnavailableError as exc:
        raise APIError(503, str(exc), code="codec_unavailable", headers={"Retry-After": "10"}) from None


async def codec_completion(request: Request, body: CompletionRequest, prompts: list[list[int]], settings: Settings,
                           sample: Sample) -> JSONResponse | StreamingResponse:
    """Encode mode samples through ``sample`` (the ordinary completion path, with a coding observer)."""
    codec_field = body.codec
    assert codec_field is not None
    if not settings.enable_codec:
        raise APIError(400, "the codec is disabled on this server", param="codec", code="codec_disabled")
    if body.prediction is not None or body.n != 1 or len(prompts) != 1 or body.logprobs is not None:
        raise APIError(400, "codec needs a single prompt, n=1, and no prediction or logprobs", param="codec",
                       code="codec_unsupported_request")
    for field in ("prompt_logprobs", "repetition_detection", "logprob_token_ids"):
        if getattr(body, field) is not None:
            raise APIError(400, f"codec cannot be combined with {field}", param=field,
                           code="codec_unsupported_request")
    for field in ("skip_special_tokens", "spaces_between_special_tokens"):
        if not getattr(body, field):
            raise APIError(400, f"codec replays render text as the engine does by default, so {field} must be "
                                "true", param=field, code="codec_unsupported_request")
    codec = codec_for(request)
    vocab = codec.vocab_size
    if codec_field.top_k >= vocab:
        raise APIError(400, f"codec.top_k must be below the vocabulary size {vocab}", param="codec.top_k")
    stream, include_usage = stream_flags(body)
    if codec_field.mode == "encode":
        if codec_field.data is not None:
            raise APIError(400, "codec.data is only for mode 'decode'", param="codec.data")
        if codec_field.check is not None:
            raise APIError(400, "codec.check is only for mode 'decode'", param="codec.check")
        if codec_field.token_ids is not None:
            return await _forced_encode(request, body, prompts[0], stream, settings, codec)
        return await sample(codec)
    if codec_field.token_ids is not None:
        raise APIError(400, "codec.token_ids is only for mode 'encode' (decode mode regenerates them)",
                       param="codec.token_ids")
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
    check = codec_field.check
    try:
        if check is not None:
            check_identity(check, codec, prompts[0])
        ids = await until_disconnect(request, lambda: codec.decode_tokens_from(
            prompts[0], payload, tokens, tokens, codec_field.top_k, codec_field.precision_bits, any_bytes=True,
            weighted_escapes=False))
        if check is not None:
            check_tokens(check, ids)
            recoded, _ = await until_disconnect(request, lambda: codec.encode_tokens(
                prompts[0], ids, len(ids), codec_field.top_k, codec_field.precision_bits, any_bytes=True,
                weighted_escapes=False))
            check_canonical(payload, recoded)
    except ReplayMismatchError as exc:
        raise APIError(exc.status, str(exc), param=exc.param, code=exc.code) from None
    summary = {"mode": "decode", "tokens": len(ids), "token_ids": ids, "verified": check is not None}
    return _replayed(request, body, prompts[0], ids, summary, stream, include_usage, settings, codec)


def _replayed(request: Request, body: CompletionRequest, prompt: list[int], ids: list[int], summary: dict[str, Any],
              stream: bool, include_usage: bool, settings: Settings, codec: CodecPipeline
              ) -> JSONResponse | StreamingResponse:
    """A completion whose tokens the codec produced (no engine sampled them), rendered as the engine
    rendered them when they were sampled (``sampled_text``)."""
    created = int(time.time())
    sampled = _sampled_text(request, body, prompt, ids, codec)
    choice = choice_body("completion", 0, sampled.text, None, sampled.finish_reason, chunk=stream,
                         stop_reason=sampled.stop_reason) | _token_ids(body, prompt, ids)
    counts = usage(len(prompt), len(ids))
    if not stream:
        reply = envelope("completion", reply_id(request), settings.model_name, chunk=False, created=created)
        reply.update(choices=[choice], usage=counts, codec=summary)
        return JSONResponse(reply)

    async def events() -> AsyncIterator[bytes]:
        chunk = envelope("completion", reply_id(request), settings.model_name, chunk=True, created=created)
        chunk.update(choices=[choice], codec=summary)
        if include_usage:
            chunk["usage"] = None
        yield sse_data(chunk)
        if include_usage:
            final = envelope("completion", reply_id(request), settings.model_name, chunk=True, created=created)
            final.update(choices=[], usage=counts)
            yield sse_data(final)
        yield SSE_DONE

    return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)


async def _forced_encode(request: Request, request_body: CompletionRequest, prompt: list[int], stream: bool,
                         settings: Settings, codec: CodecPipeline) -> JSONResponse:
    """``codec: {"mode": "encode", "token_ids": [...]}``: code given tokens after the prompt (teacher
    forcing) instead of sampling — the inverse of decode mode, token for token."""
    codec_field = request_body.codec
    assert codec_field is not None
    if stream:
        raise APIError(400, "codec encode with token_ids is not streamed", param="stream")
    ids = list(check_token_ids(codec_field.token_ids or [], codec.vocab_size, "codec.token_ids"))
    resolve_max_tokens(len(ids), len(prompt), settings, "codec.token_ids")
    payload, _ = await until_disconnect(request, lambda: codec.encode_tokens(
        prompt, ids, len(ids), codec_field.top_k, codec_field.precision_bits, any_bytes=True,
        weighted_escapes=False))
    sampled = _sampled_text(request, request_body, prompt, ids, codec)
    body = envelope("completion", reply_id(request), settings.model_name, chunk=False, created=int(time.time()))
    body["choices"] = [choice_body("completion", 0, sampled.text, None, sampled.finish_reason, chunk=False,
                                   stop_reason=sampled.stop_reason)
                       | _token_ids(request_body, prompt, ids)]
    body["usage"] = usage(len(prompt), len(ids))
    body["codec"] = {"mode": "encode", "tokens": len(ids), "top_k": codec_field.top_k,
                     "precision_bits": codec_field.precision_bits, "numerics": codec.numerics,
                     "data": base64.b64encode(payload).decode(), "check": replay_check(codec, prompt, ids)}
    return JSONResponse(body)


def _token_ids(body: CompletionRequest, prompt: list[int], ids: list[int]) -> dict[str, list[int] | None]:
    """vLLM's ``return_token_ids`` on a choice whose tokens the codec produced (null when not asked for)."""
    return {"prompt_token_ids": prompt, "token_ids": ids} if body.return_token_ids else \
        {"prompt_token_ids": None, "token_ids": None}


def _sampled_text(request: Request, body: CompletionRequest, prompt: list[int], ids: list[int],
                  codec: CodecPipeline) -> Sampled:
    """The text, finish and stop reason of ``ids`` under this request's stop rules, as the engine gave them."""
    return sampled_text(prompt, ids, body.stop_sequences(), body.ignore_eos, body.min_tokens,
                        get_gateway(request).engines.eos_token_ids, codec.tokenizer, body.stop_token_ids or (),
                        keep_stop=body.include_stop_str_in_output)
