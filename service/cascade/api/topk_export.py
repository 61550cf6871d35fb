"""``/v1/completions`` with ``"compression": true``: teacher-forced, processed top-k distributions.

No token is returned: the engine scores every prompt position through the request's sampling
stack (see ``cascade.vllm_compat.export_hook``) and the gateway renormalises and streams the result
as JSON, SSE or the compact binary layout of ``cascade_common.topk_format``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from cascade_common.topk_format import encode_document, encode_header
from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from cascade.api.accept import accepts
from cascade.api.completion_render import envelope
from cascade.api.deps import get_gateway, reply_id, request_id
from cascade.api.errors import APIError
from cascade.api.openai_protocol import CompletionRequest
from cascade.api.sampling import generation_request
from cascade.api.streaming import SSE_HEADERS, guarded, merge, sse_data, until_disconnect
from cascade.engine.manager import EngineManager
from cascade.engine.types import GenerationRequest
from cascade.export.token_table import TokenTable
from cascade.export.topk import DISTRIBUTION_TYPE, ExportPosition
from cascade.metrics import Metrics
from cascade.settings import Settings

OCTET = "application/octet-stream"
MIN_TEMPERATURE = 0.01
STREAM_BATCH = 64
_REFUSED = {
    "prediction": "prediction", "codec": "codec", "logprobs": "logprobs", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty", "repetition_penalty": "repetition_penalty", "stop": "stop",
    "response_format": "response_format", "structured_outputs": "structured_outputs",
    "prompt_logprobs": "prompt_logprobs",
}


def validate_export(body: CompletionRequest, settings: Settings) -> int:
    """Refuse what an export cannot honour; returns k."""
    if body.n != 1:
        raise APIError(400, "compression returns one distribution per position: n must be 1", param="n")
    if "max_tokens" in body.model_fields_set and body.max_tokens not in (None, 0):
        raise APIError(400, "compression samples no tokens: max_tokens must be 0 or omitted", param="max_tokens")
    for field, param in _REFUSED.items():
        if getattr(body, field) is not None:
            raise APIError(400, f"{param} cannot be combined with compression", param=param)
    if body.return_token_ids:
        raise APIError(400, "return_token_ids cannot be combined with compression (each position names its "
                            "token_id)", param="return_token_ids")
    if body.min_tokens:
        raise APIError(400, "min_tokens cannot be combined with compression", param="min_tokens")
    if body.temperature is not None and body.temperature < MIN_TEMPERATURE:
        raise APIError(400, f"compression needs temperature >= {MIN_TEMPERATURE} (vLLM raises anything lower to "
                            f"{MIN_TEMPERATURE}; 1 gives the model's own distribution)", param="temperature")
    k = body.compression_top_k
    if not 1 <= k <= settings.max_export_top_k:
        raise APIError(400, f"compression_top_k must be in 1..{settings.max_export_top_k}", param="compression_top_k")
    return k


def export_request(body: CompletionRequest, k: int, settings: Settings, vocab_size: int) -> GenerationRequest:
    """The request's sampling stack applied to its own prompt; the engine samples one internal token
    (it cannot stop before sampling once), which is never returned or counted."""
    sampling = generation_request(body.model_copy(update={"min_tokens": 0}), max_tokens=1, logprobs=None,
                                  settings=settings, vocab_size=vocab_size, stream=False)
    return dataclasses.replace(sampling, export_top_k=k)


def render_position(position: ExportPosition, table: TokenTable) -> dict[str, Any]:
    top = [{"token": table.string(t), "token_id": t, "logprob": lp, "bytes": list(table.data(t)), "rank": rank}
           for rank, (t, lp) in enumerate(zip(position.ids, position.logprobs, strict=True), start=1)]
    return {"token": table.string(position.target), "token_id": position.target,
            "logprob": position.target_logprob, "bytes": list(table.data(position.target)),
            "rank": position.target_rank, "top_logprobs": top}


def _streams(engines: EngineManager, prompts: list[list[int]], export: GenerationRequest,
             rid: str) -> list[AsyncIterator[list[ExportPosition]]]:
    async def one(i: int, prompt: list[int]) -> AsyncIterator[list[ExportPosition]]:
        yield await engines.export(prompt, export, f"{rid}-{i}")

    return [one(i, p) for i, p in enumerate(prompts)]


def _logprobs_block(k: int, content: list[dict[str, Any]], offset: int) -> dict[str, Any]:
    return {"distribution_type": DISTRIBUTION_TYPE, "top_k": k, "offset": offset, "content": content}


async def export_completion(request: Request, body: CompletionRequest, prompts: list[list[int]], settings: Settings,
                            engines: EngineManager, metrics: Metrics) -> JSONResponse | StreamingResponse:
    k = validate_export(body, settings)
    for prompt in prompts:
        if len(prompt) >= settings.max_model_len:
            raise APIError(400, f"This model's maximum context length is {settings.max_model_len} tokens; an export "
                                f"scores at most {settings.max_model_len - 1} and the prompt has {len(prompt)}. "
                                "Split the text into windows (cascade export-topk does this).",
                           param="prompt", code="context_length_exceeded")
    values = sum(len(p) - 1 for p in prompts) * k
    if values > settings.max_export_values:
        raise APIError(400, f"this export would return {values} values (positions × compression_top_k); the limit "
                            f"is {settings.max_export_values} (max_export_values): send fewer or shorter prompts "
                            "per request, or a smaller compression_top_k", param="compression_top_k")
    export = export_request(body, k, settings, len(engines.tokenizer))
    engines.validate(export)
    rid = request_id(request)
    table = get_gateway(request).token_table()
    prompt_tokens = sum(len(p) for p in prompts)
    metrics.prompt_tokens.labels("export").inc(prompt_tokens)
    if body.stream and not accepts(request, OCTET):
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        events = _sse(engines, prompts, export, k, rid, int(time.time()), settings, table, metrics, include_usage,
                      reply_id(request))
        return StreamingResponse(guarded(events), media_type="text/event-stream", headers=SSE_HEADERS)
    tasks = [asyncio.ensure_future(engines.export(p, export, f"{rid}-{i}")) for i, p in enumerate(prompts)]
    try:
        await until_disconnect(request, lambda: asyncio.shield(tasks[0]))
    except BaseException:
        await _cancel(tasks)
        raise
    if accepts(request, OCTET):
        return StreamingResponse(_binary(tasks, k, len(engines.tokenizer), metrics), media_type=OCTET,
                                 headers={"X-Cascade-Top-K": str(k)})
    head = envelope("completion", reply_id(request), settings.model_name, chunk=False, created=int(time.time()))
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 0, "total_tokens": prompt_tokens}
    return StreamingResponse(_json(tasks, k, head, usage, table, metrics), media_type="application/json")


async def _sse(engines: EngineManager, prompts: list[list[int]], export: GenerationRequest, k: int, rid: str,
               created: int, settings: Settings, table: TokenTable, metrics: Metrics,
               include_usage: bool, shown_id: str | None = None) -> AsyncIterator[bytes]:
    """One event per ``STREAM_BATCH`` positions, each rendered off the event loop (as ``_json`` does):
    a batch of 64 positions × 1,024 values is tens of milliseconds of Python, and rendered on the loop
    a whole document stalled every other request for seconds, most of all once its client had gone
    (writes then return at once, so nothing paced the rendering)."""
    shown = shown_id or rid  # the reply's id (vLLM's request_id); engine requests derive from rid
    async for index, positions in merge(_streams(engines, prompts, export, rid)):
        metrics.export_positions.inc(len(positions))
        for start in range(0, max(len(positions), 1), STREAM_BATCH):
            batch = positions[start:start + STREAM_BATCH]
            last = start + STREAM_BATCH >= len(positions)
            head = envelope("completion", shown, settings.model_name, chunk=True, created=created)
            yield await asyncio.to_thread(_sse_batch, head, index, batch, last, k, table)
    if include_usage:
        total = sum(len(p) for p in prompts)
        chunk = envelope("completion", shown, settings.model_name, chunk=True, created=created)
        chunk["choices"] = []
        chunk["usage"] = {"prompt_tokens": total, "completion_tokens": 0, "total_tokens": total}
        yield sse_data(chunk)


def _sse_batch(chunk: dict[str, Any], index: int, batch: Sequence[ExportPosition], last: bool, k: int,
               table: TokenTable) -> bytes:
    offset = batch[0].index if batch else 1
    chunk["choices"] = [{"index": index, "text": "", "finish_reason": "length" if last else None,
                         "logprobs": _logprobs_block(k, [render_position(p, table) for p in batch], offset)}]
    return sse_data(chunk)


async def _cancel(tasks: Sequence[asyncio.Future[list[ExportPosition]]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _render_batch(positions: Sequence[ExportPosition], table: TokenTable) -> bytes:
    return ",".join(_dumps(render_position(p, table)) for p in positions).encode()


async def _json(tasks: Sequence[asyncio.Future[list[ExportPosition]]], k: int, head: dict[str, Any],
                usage: dict[str, Any], table: TokenTable, metrics: Metrics) -> AsyncIterator[bytes]:
    """The plain JSON reply, written as it is rendered: ``STREAM_BATCH`` positions at a time, each
    prompt's positions released once written, so the gateway never holds the rendered document
    (about 100 bytes of JSON and ~1 KB of Python objects per value). The first prompt finished
    before the status line went out; a later failure cuts the body, which no JSON parser accepts."""
    pending: list[asyncio.Future[list[ExportPosition]] | None] = list(tasks)
    del tasks
    try:
        yield _dumps(head)[:-1].encode() + b',"choices":['
        for index, task in enumerate(pending):
            assert task is not None
            positions = await task
            pending[index] = None
            del task
            metrics.export_positions.inc(len(positions))
            choice = _dumps({"index": index, "text": "", "finish_reason": "length",
                             "logprobs": _logprobs_block(k, [], 1)})
            yield (b"," if index else b"") + choice[:-3].encode()  # open: ...,"content":[
            for start in range(0, len(positions), STREAM_BATCH):
                batch = positions[start:start + STREAM_BATCH]
                yield (b"," if start else b"") + await asyncio.to_thread(_render_batch, batch, table)
            del positions
            yield b"]}}"
        yield b'],"usage":' + _dumps(usage).encode() + b"}"
    finally:
        await _cancel([task for task in pending if task is not None])


async def _binary(tasks: Sequence[asyncio.Future[list[ExportPosition]]], k: int, vocab_size: int,
                  metrics: Metrics) -> AsyncIterator[bytes]:
    """Header, then one document block per prompt in prompt order (all prompts run concurrently).
    The first prompt finished before the status line went out; a later failure ends the body
    early, which the reader reports as truncation."""
    try:
        yield encode_header(k, vocab_size)
        for index, task in enumerate(tasks):
            positions = await task
            metrics.export_positions.inc(len(positions))
            yield await asyncio.to_thread(
                encode_document, f"prompt-{index}", 1, k, [p.target for p in positions],
                [p.ids for p in positions], [p.logprobs for p in positions])
    finally:
        await _cancel(tasks)
