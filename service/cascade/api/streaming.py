"""SSE framing (``cascade_common.sse``), the streams' one error path (``guarded``), and the two ways a
client can leave: a dropped stream or a dropped plain request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from cascade_common import sse
from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from cascade.api.errors import APIError, as_api_error, error_body, is_engine_failure

T = TypeVar("T")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_data(payload: Any) -> bytes:
    """One ``data:`` event (OpenAI's streaming framing)."""
    return sse.data_event(payload)


def sse_event(event: str, payload: Any) -> bytes:
    """A named event (the codec and k-CBS streams)."""
    return sse.named_event(event, payload)


SSE_DONE = sse.DONE


def error_payload(exc: BaseException, *, type_: str | None = None) -> dict[str, Any]:
    """What a stream sends when it fails after the 200 header went out; ``status`` is the one the
    same failure would have had as a plain reply. ``type_`` replaces the status's error type."""
    if (error := as_api_error(exc)) is not None:
        status, message, param, code = error.status, error.message, error.param, error.code
    elif is_engine_failure(exc):
        status, message, param, code = 503, "The engine failed while serving this request", None, "engine_unavailable"
    else:
        status, message, param, code = 500, "Internal server error", None, "internal_error"
    body = error_body(status, message, param, code)["error"]  # the message cut and made encodable, the type
    return sse.error_object(status, body["message"], param=body["param"], code=code, type_=type_ or body["type"])


def error_event(exc: BaseException, *, event: str | None = None, type_: str | None = None,
                shape: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> bytes:
    """``error_payload`` as an event: unnamed (OpenAI-style streams) or named ``event``; ``shape``
    recasts the payload for a stream whose error event has another form (the Responses API's)."""
    payload = error_payload(exc, type_=type_)
    if shape is not None:
        payload = shape(payload)
    return sse_data(payload) if event is None else sse_event(event, payload)


async def guarded(events: AsyncIterator[bytes], *, done: bool = True, event: str | None = None,
                  type_: str | None = None, translate: Callable[[Exception], BaseException] | None = None,
                  shape: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> AsyncIterator[bytes]:
    """Pass a stream's events through; a failure (any ``Exception``, never a cancellation) becomes
    the error event (``error_event``: named ``event``, typed ``type_``, from ``translate(exc)`` when
    given) and ends the stream. With ``done`` (OpenAI-style streams) the stream always ends with
    ``data: [DONE]``, after the error event too; named-event streams end with their own event.

    The one place a stream turns a failure after its 200 header into an event."""
    try:
        async for item in events:
            yield item
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        yield error_event(translate(exc) if translate is not None else exc, event=event, type_=type_, shape=shape)
    finally:
        if isinstance(events, AsyncGenerator):
            await events.aclose()
    if done:
        yield SSE_DONE


async def until_disconnect(request: Request, work: Callable[[], Awaitable[T]], poll: float = 0.25,
                           body_done: asyncio.Event | None = None) -> T:
    """Run ``work``; if the client goes away first, cancel it (which aborts its engine requests).

    ``body_done``: ``work`` still reads the request body, so only look for the disconnect once it
    has all been read (looking reads ``receive`` and would steal a body chunk)."""
    task = asyncio.ensure_future(work())
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll)
            if done:
                return task.result()
            if (body_done is None or body_done.is_set()) and await request.is_disconnected():
                task.cancel()
                raise APIError(499, "client disconnected")
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def merge(streams: list[AsyncIterator[T]]) -> AsyncGenerator[tuple[int, T], None]:
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


async def primed(request: Request, stream: AsyncGenerator[T, None]) -> AsyncIterator[T]:
    """Wait for ``stream``'s first item before the 200 goes out, then yield it and the rest.

    vLLM validates a request when the engine admits it, i.e. on the first item; waiting for it
    turns an invalid request into a plain 4xx instead of a 200 followed by an error event."""

    async def first() -> tuple[bool, T | None]:
        try:
            return True, await anext(stream)
        except StopAsyncIteration:
            return False, None

    try:
        has_first, item = await until_disconnect(request, first)
    except BaseException:
        await stream.aclose()
        raise

    async def chained() -> AsyncIterator[T]:
        try:
            if has_first:
                yield item  # type: ignore[misc]
            async for rest in stream:
                yield rest
        finally:
            await stream.aclose()

    return chained()


class BodyThenDisconnectResponse(StreamingResponse):
    """A streaming response for handlers that keep reading the request body while they answer.

    Starlette's ``StreamingResponse`` listens for the client's disconnect by reading ``receive``
    from the start, which would steal the body chunks a streaming ``/compress`` still needs. This
    one waits until the handler has read the whole body (``body_done``) and only then watches for
    the disconnect, cancelling the stream (and so its engine requests) when the client leaves.
    """

    def __init__(self, content: AsyncIterator[bytes], body_done: asyncio.Event, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.body_done = body_done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        stream = asyncio.ensure_future(self.stream_response(send))

        async def watch() -> None:
            await self.body_done.wait()
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    stream.cancel()
                    return

        watcher = asyncio.ensure_future(watch())
        try:
            await stream
        except asyncio.CancelledError:
            if not stream.cancelled():
                raise
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)


BODY_READ_AHEAD_CHUNKS = 256


async def track_end(stream: AsyncIterator[bytes], done: asyncio.Event) -> AsyncIterator[bytes]:
    """Pass a body stream through, reading it ahead in a task; ``done`` is set once the upload ended.

    The codec consumes its input lazily (one segment at a time), so without reading ahead the last
    body message would only be read when the last segment is coded, and the response could not
    watch for the client leaving until then: a dropped /decompress or /compress kept its engine
    requests running to the end. Reading ahead (at most ``BODY_READ_AHEAD_CHUNKS`` chunks, so
    memory stays bounded) lets ``done`` fire as soon as the client has sent everything.
    """
    queue: asyncio.Queue[bytes | Exception | None] = asyncio.Queue(BODY_READ_AHEAD_CHUNKS)

    async def pump() -> None:
        try:
            async for chunk in stream:
                await queue.put(chunk)
            await queue.put(None)
        except Exception as exc:
            await queue.put(exc)
        finally:
            done.set()

    reader = asyncio.ensure_future(pump())
    try:
        while (item := await queue.get()) is not None:
            if isinstance(item, Exception):
                raise item
            yield item
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        done.set()
