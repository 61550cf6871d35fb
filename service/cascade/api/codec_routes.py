"""``/compress`` and ``/decompress``: validate, pick the body and response forms, stream."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import re
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated, Any, TypeVar
from urllib.parse import parse_qsl

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import AfterValidator, Field, ValidationError
from starlette.requests import ClientDisconnect

from cascade.api.accept import accepts
from cascade.api.deps import get_gateway, get_metrics, get_settings, request_id
from cascade.api.errors import APIError
from cascade.api.middleware import BodyRefusedError
from cascade.api.openai_protocol import LoneSurrogateError, StrictModel
from cascade.api.streaming import (
    SSE_HEADERS,
    BodyThenDisconnectResponse,
    guarded,
    sse_event,
    track_end,
    until_disconnect,
)
from cascade.codec.container import PRECISIONS, ContainerError
from cascade.codec.pipeline import (
    CodecPipeline,
    CodecUnavailableError,
    CompressOptions,
    CompressStats,
    IntegrityError,
    ModelMismatchError,
)
from cascade.engine.manager import EngineNotReadyError
from cascade.lifecycle import Gateway
from cascade.metrics import Metrics
from cascade.settings import Settings

T = TypeVar("T")
P = TypeVar("P", bound="CompressParams")
M = TypeVar("M", bound=StrictModel)
router = APIRouter(tags=["codec"])
OCTET = "application/octet-stream"


def _precision(bits: int) -> int:
    if bits not in PRECISIONS:
        raise ValueError(f"Input should be one of {', '.join(map(str, PRECISIONS))}")
    return bits


class CompressParams(StrictModel):
    model: str | None = None
    context: str | None = None
    precision_bits: Annotated[int, Field(strict=True), AfterValidator(_precision)] | None = None
    top_k: Annotated[int, Field(ge=1, le=1024)] | None = None
    lane_tokens: Annotated[int, Field(ge=16)] | None = None
    lanes: Annotated[int, Field(ge=1, le=64)] | None = None
    segment_tokens: Annotated[int, Field(ge=16)] | None = Field(None, description="Deprecated name of lane_tokens.")
    verify: bool = False


class CompressBody(CompressParams):
    text: str


class DecompressParams(StrictModel):
    model: str | None = None


class DecompressBody(DecompressParams):
    data: str


def _count_error(metrics: Metrics, exc: BaseException) -> None:
    """A codec failure for operators; a client hanging up mid-upload is not one (the access log counts it 499)."""
    if not isinstance(exc, ClientDisconnect):
        metrics.codec_errors.labels(type(exc).__name__).inc()


def get_codec(request: Request) -> CodecPipeline:
    return get_gateway(request).codec


def _guarded(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A codec stream: a failure after the 200 header went out ends it with an ``error`` event (the
    streams' error payload, typed ``codec_error``); there is no ``[DONE]`` (``done`` ends a success)."""
    return guarded(events, done=False, event="error", type_="codec_error", translate=_as_api_error)


def _as_api_error(exc: BaseException) -> APIError:
    """Codec failures in the OpenAI error shape; bad input is always 4xx."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ModelMismatchError):
        return APIError(409, str(exc), code=exc.code)
    if isinstance(exc, ContainerError):
        return APIError(422 if exc.code == "damaged_container" else 400, str(exc), code=exc.code)
    if isinstance(exc, IntegrityError):
        return APIError(422, str(exc), code=exc.code)
    if isinstance(exc, CodecUnavailableError | EngineNotReadyError):
        return APIError(503, str(exc), code="codec_unavailable", headers={"Retry-After": "10"})
    if isinstance(exc, UnicodeDecodeError):
        return APIError(400, "context must be UTF-8 text", param="context", code="invalid_context")
    if isinstance(exc, BodyRefusedError):
        return APIError(exc.status, exc.message, code=exc.code)
    return APIError(500, "Internal server error", code="internal_error")


async def _when_ready(gateway: Gateway, stream: AsyncGenerator[T, None]) -> AsyncIterator[T]:
    """``stream``, once the codec may serve (else its 503 reason, raised where the stream is read)."""
    try:
        gateway.ready_codec()
        async for item in stream:
            yield item
    finally:
        await stream.aclose()


def _wants_sse(request: Request) -> bool:
    return accepts(request, "text/event-stream")


def _media_type(output: bytes) -> str:
    """UTF-8 text is labelled as text; any other bytes as what they are."""
    if output.isascii():
        return "text/plain; charset=utf-8"
    try:
        output.decode("utf-8")
    except UnicodeDecodeError:
        return OCTET
    return "text/plain; charset=utf-8"


def _check_model(model: str | None, settings: Settings) -> None:
    if model is not None and model not in (settings.model_name, settings.model):
        raise APIError(404, f"The model '{model}' does not exist; this service serves '{settings.model_name}'",
                       param="model", code="model_not_found")


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _limited(stream: AsyncIterator[bytes], limit: int) -> AsyncIterator[bytes]:
    seen = 0
    async for chunk in stream:
        seen += len(chunk)
        if seen > limit:
            raise APIError(413, f"input is larger than the limit of {limit} bytes", code="input_too_large")
        if chunk:
            yield chunk


async def _prime(stream: AsyncIterator[bytes]) -> tuple[bytes, AsyncIterator[bytes]]:
    """Run a stream to its first item so validation errors still become proper 4xx responses."""
    try:
        first = await anext(stream)
    except StopAsyncIteration:
        first = b""
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        raise _as_api_error(exc) from None
    return first, stream


_INT_PARAMS = frozenset(("precision_bits", "top_k", "lane_tokens", "lanes", "segment_tokens"))
_BOOL_PARAMS = {"verify"}
_BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
_ASCII_INT = re.compile(r"-?[0-9]{1,18}")


def _query_value(key: str, raw: str) -> object:
    """A query parameter as the JSON value it stands for: integers in ASCII digits (``²`` or ``١٢`` are
    not numbers here), booleans ``true``/``false``/``1``/``0``/``yes``/``no`` in any case; else 400."""
    if key in _INT_PARAMS:
        if not _ASCII_INT.fullmatch(raw):
            raise APIError(400, f"Invalid query parameter '{key}': an integer written in ASCII digits is required",
                           param=key, code="invalid_parameter")
        return int(raw)
    if key in _BOOL_PARAMS:
        value = _BOOLEANS.get(raw.lower())
        if value is None:
            raise APIError(400, f"Invalid query parameter '{key}': true or false is required (also 1/0, yes/no)",
                           param=key, code="invalid_parameter")
        return value
    return raw


def _undecodable(text: str) -> bool:
    """Whether percent-decoding left a byte that is not UTF-8 (kept as a lone surrogate)."""
    return any("\udc80" <= c <= "\udcff" for c in text)


def _query(request: Request) -> dict[str, object]:
    """The query parameters, each once, percent-decoded as strict UTF-8 (``%FF`` or a lone surrogate
    is a 400, not silently U+FFFD), as the values they stand for (``_query_value``)."""
    try:
        pairs = parse_qsl(request.scope.get("query_string", b"").decode("utf-8"), keep_blank_values=True,
                          errors="surrogateescape")
    except UnicodeDecodeError:
        raise APIError(400, "Invalid query string: percent-encoded bytes must be UTF-8 text",
                       code="invalid_query_string") from None
    query: dict[str, object] = {}
    for key, raw in pairs:
        if _undecodable(key) or _undecodable(raw):
            raise APIError(400, "Invalid query string: percent-encoded bytes must be UTF-8 text",
                           param=None if _undecodable(key) else key, code="invalid_query_string")
        if not key:
            raise APIError(400, "Invalid query string: a parameter without a name", code="invalid_query_string")
        if key in query:
            raise APIError(400, f"Invalid query parameter '{key}': given more than once",
                           param=key, code="duplicate_parameter")
        query[key] = _query_value(key, raw)
    return query


def _nothing_beside_json(query: dict[str, object]) -> None:
    if query:
        name = next(iter(query))
        raise APIError(400, f"Invalid query parameter '{name}': with a JSON body every parameter goes in the "
                            "body", param=name, code="parameter_outside_body")


def _invalid(exc: ValidationError, where: str) -> APIError:
    first = exc.errors()[0]
    loc = [str(p) for p in first["loc"]]
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, LoneSurrogateError):
        loc += [str(p) for p in cause.path]
    param = ".".join(loc) or None
    what = f"{where} '{param}'" if param else "request body"
    return APIError(400, f"Invalid {what}: {first['msg']}", param=param, code="invalid_parameter")


class _DuplicateKeyError(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each given once (like a query parameter: a repeat is a 400, not last-wins)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKeyError(key)
        out[key] = value
    return out


def _json_body(model: type[M], data: bytes) -> M:
    """A JSON body validated strictly. Parsed by ``json`` first, which keeps a lone surrogate escape
    (``"\\ud800"``) as text, so the 400 names the field holding it, as on the ``/v1`` routes."""
    try:
        value = json.loads(data, object_pairs_hook=_unique_keys)
    except _DuplicateKeyError as exc:
        raise APIError(400, f"Invalid value for '{exc.key}': given more than once", param=exc.key,
                       code="duplicate_parameter") from None
    except (ValueError, RecursionError) as exc:
        raise APIError(400, f"Request body is not valid JSON: {exc}", code="invalid_json") from None
    try:
        return model.model_validate(value, strict=True)
    except ValidationError as exc:
        raise _invalid(exc, "value for") from None


def _one_spelling(params: P) -> P:
    """``segment_tokens`` is ``lane_tokens``'s deprecated name: both at once is a 400, not one dropped."""
    if params.lane_tokens is not None and params.segment_tokens is not None:
        raise APIError(400, "Give lane_tokens or its deprecated name segment_tokens, not both",
                       param="segment_tokens", code="duplicate_parameter")
    return params


async def _compress_params(request: Request, settings: Settings) -> tuple[CompressParams, AsyncIterator[bytes]]:
    """One typing rule: a JSON body's values must have their JSON type (integers as numbers, booleans as
    true/false — ``"8"`` is refused), validated strictly; a query parameter is text standing for that
    same value (``_query_value``) and goes through the same strict validation."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    query = _query(request)
    if content_type == "application/json":
        _nothing_beside_json(query)
        body = _json_body(CompressBody, await request.body())
        return _one_spelling(body), _one(body.text.encode("utf-8"))
    if content_type in ("text/plain", OCTET, ""):
        try:
            params = CompressParams.model_validate(query, strict=True)
        except ValidationError as exc:
            raise _invalid(exc, "query parameter") from None
        return _one_spelling(params), request.stream()
    raise APIError(415, f"unsupported content type '{content_type}': send application/json, text/plain or "
                        f"{OCTET}", code="unsupported_media_type")


@router.post("/compress", response_model=None)
async def compress(request: Request, settings: Settings = Depends(get_settings),
                   codec: CodecPipeline = Depends(get_codec),
                   metrics: Metrics = Depends(get_metrics)) -> Response:
    params, source = await _compress_params(request, settings)
    _check_model(params.model, settings)
    try:
        get_gateway(request).ready_codec()
    except (CodecUnavailableError, EngineNotReadyError) as exc:
        raise _as_api_error(exc) from None
    options = CompressOptions(
        top_k=params.top_k or min(settings.codec_top_k, codec.vocab_size - 1),
        precision_bits=params.precision_bits or settings.codec_precision_bits,
        lane_tokens=params.lane_tokens or params.segment_tokens or settings.codec_lane_tokens,
        lanes=params.lanes or settings.codec_lanes,
        context=(params.context or "").encode("utf-8"), verify=params.verify,
        step_budget=0 if params.lane_tokens or params.segment_tokens or params.lanes else settings.codec_lane_steps,
        extra_lanes=settings.codec_lane_extra)
    if len(options.context) > settings.codec_max_context_bytes:
        raise APIError(400, f"context may be at most {settings.codec_max_context_bytes} bytes",
                       param="context", code="context_too_large")
    if options.top_k >= codec.vocab_size:
        raise APIError(400, f"top_k must be below the vocabulary size {codec.vocab_size}",
                       param="top_k", code="invalid_parameter")
    if codec.max_lane_tokens(len(codec.context_tokens(options.context))) < 16:
        raise APIError(400, "context leaves no room for text in the model's context window",
                       param="context", code="context_too_long")
    stats = CompressStats()
    rid = request_id(request)
    body_done = asyncio.Event()
    source = track_end(_limited(source, settings.codec_max_input_bytes), body_done)
    stream = codec.compress(source, options, stats, rid)
    header, stream = await _prime(stream)

    def account(failed: BaseException | None) -> None:
        if failed is not None:
            _count_error(metrics, failed)
            return
        metrics.codec_tokens.labels("compress").inc(stats.tokens)
        metrics.codec_bits.inc(stats.payload_bits)
        metrics.codec_bytes_in.inc(stats.bytes_in)
        metrics.codec_bytes_out.inc(stats.bytes_out)
        if stats.tokens:
            metrics.codec_bits_per_token.observe(stats.payload_bits / stats.tokens)
        if stats.bytes_out:
            metrics.codec_ratio.observe(stats.bytes_in / stats.bytes_out)

    if _wants_sse(request):
        async def events() -> AsyncIterator[bytes]:
            seq = 0
            try:
                for part in [header]:
                    yield sse_event("chunk", {"seq": seq, "data": base64.b64encode(part).decode()})
                    seq += 1
                async for part in stream:
                    yield sse_event("chunk", {"seq": seq, "data": base64.b64encode(part).decode()})
                    seq += 1
                account(None)
                yield sse_event("done", stats.as_dict())
            except Exception as exc:
                account(exc)
                raise

        return BodyThenDisconnectResponse(_guarded(events()), body_done, media_type="text/event-stream",
                                          headers=SSE_HEADERS)

    async def raw() -> AsyncIterator[bytes]:
        yield header
        try:
            async for part in stream:
                yield part
            account(None)
        except Exception as exc:
            account(exc)
            raise

    return BodyThenDisconnectResponse(raw(), body_done, media_type=OCTET,
                                      headers={"Content-Disposition": 'attachment; filename="data.cz"'})


async def _container_source(request: Request, settings: Settings) -> AsyncIterator[bytes]:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    query = _query(request)
    if content_type == "application/json":
        _nothing_beside_json(query)
        body = _json_body(DecompressBody, await request.body())
        _check_model(body.model, settings)
        try:
            data = base64.b64decode(body.data, validate=True)
        except (binascii.Error, ValueError):
            raise APIError(400, "data is not valid base64", param="data", code="invalid_base64") from None
        return _one(data)
    if content_type in (OCTET, ""):
        try:
            params = DecompressParams.model_validate(query, strict=True)
        except ValidationError as exc:
            raise _invalid(exc, "query parameter") from None
        _check_model(params.model, settings)
        return _limited(request.stream(), settings.codec_max_container_bytes)
    raise APIError(415, f"unsupported content type '{content_type}': send {OCTET} or application/json",
                   code="unsupported_media_type")


@router.post("/decompress", response_model=None)
async def decompress(request: Request, settings: Settings = Depends(get_settings),
                     codec: CodecPipeline = Depends(get_codec), metrics: Metrics = Depends(get_metrics)) -> Response:
    body_done = asyncio.Event()
    source = track_end(await _container_source(request, settings), body_done)
    rid = request_id(request)
    stream = _when_ready(get_gateway(request), codec.decompress(source, rid))
    if not _wants_sse(request):
        async def collect() -> list[bytes]:
            return [data async for _, data in stream]

        try:
            parts = await until_disconnect(request, collect, body_done=body_done)
        except APIError:
            raise
        except Exception as exc:
            _count_error(metrics, exc)
            raise _as_api_error(exc) from None
        output = b"".join(parts)
        return Response(output, media_type=await asyncio.to_thread(_media_type, output))

    async def events() -> AsyncGenerator[bytes, None]:
        total = segments = 0
        try:
            async for index, data in stream:
                total += len(data)
                segments += 1
                try:
                    payload: dict[str, Any] = {"segment": index, "text": data.decode("utf-8")}
                except UnicodeDecodeError:
                    payload = {"segment": index, "data_b64": base64.b64encode(data).decode()}
                yield sse_event("text", payload)
            yield sse_event("done", {"segments": segments, "bytes": total, "verified": True})
        except Exception as exc:
            _count_error(metrics, exc)
            raise

    return BodyThenDisconnectResponse(_guarded(events()), body_done, media_type="text/event-stream",
                                      headers=SSE_HEADERS)
