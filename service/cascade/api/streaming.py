"""SSE framing and the two ways a client can leave: a dropped stream or a dropped plain request."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request

from cascade.api.errors import APIError, error_body
from cascade.engine.manager import EngineNotReadyError

T = TypeVar("T")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_data(payload: Any) -> bytes:
    """One ``data:`` event (OpenAI's streaming framing)."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def sse_event(event: str, payload: Any) -> bytes:
    """A named event (the codec and k-CBS streams)."""
    return f"event: {event}\n".encode() + sse_data(payload)


SSE_DONE = b"data: [DONE]\n\n"


def error_payload(exc: BaseException) -> dict[str, Any]:
    """What a stream sends when it fails after the 200 header went out."""
    if isinstance(exc, APIError):
        return error_body(exc.status, exc.message, exc.param, exc.code)
    if isinstance(exc, EngineNotReadyError):
        return error_body(503, str(exc), code="engine_unavailable")
    return error_body(500, "Internal server error", code="internal_error")


async def until_disconnect(request: Request, work: Callable[[], Awaitable[T]], poll: float = 0.25) -> T:
    """Run ``work``; if the client goes away first, cancel it (which aborts its engine requests)."""
    task = asyncio.ensure_future(work())
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                raise APIError(499, "client disconnected")
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def merge(streams: list[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """Interleave several async iterators as items arrive, tagging each with its stream index."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield 0, item
        return
    queue: asyncio.Queue[tuple[int, T] | BaseException | None] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                await queue.put((index, item))
        except BaseException as exc:
            await queue.put(exc)
            raise
        finally:
            await queue.put(None)

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    remaining = len(tasks)
    try:
        while remaining:
            entry = await queue.get()
            if entry is None:
                remaining -= 1
            elif isinstance(entry, BaseException):
                raise entry
            else:
                yield entry
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
