"""Async client (httpx.AsyncClient) with the sync client's API, method for method.

Protocol, results and errors come from ``protocol``; this module only moves bytes, asynchronously.
Sources and sinks may be the sync ones (files are read on a worker thread, so a slow disk or pipe
never stalls the event loop) or async ones: an ``asyncio.StreamReader``/``StreamWriter``, an
object with ``async read``/``async write``, or an async iterable of bytes. Codec uploads run
concurrently with reading the reply (see ``duplex``).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import io
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from pathlib import Path
from typing import Any, TypeVar, Union, cast

import httpx
from httpx_sse import EventSource

from cascade_client import protocol
from cascade_client._http import (
    ClientBase,
    adrive,
    asend,
    broken_stream,
    client_options,
    request_args,
    transport_errors,
)
from cascade_client._io import Body, Sink, Source, check_endpoints, flush_sink, from_thread, write_sink
from cascade_client.duplex import AsyncDuplexTransport
from cascade_client.protocol import CompressStats, DecompressStats, JsonCall, KcbsResult, Progress, StreamCall
from cascade_client.retry import RetryPolicy
from cascade_client.spread import DEFAULT_PIECE_BYTES, compress_spread, decompress_spread
from cascade_client.topk_document import TopkDocument
from cascade_client.topk_export import ExportStats, TopkExporter

__all__ = ["AsyncCascadeClient", "AsyncSink", "AsyncSource"]

R = TypeVar("R")
AsyncSource = Union[Source, AsyncIterable[bytes], asyncio.StreamReader, Any]  # noqa: UP007 (runtime alias)
AsyncSink = Union[Sink, asyncio.StreamWriter, Any]  # noqa: UP007


class AsyncBody:
    """A request body from an async or sync source; ``chunks()`` starts it again for a retry where
    that is possible (see ``Body``: async sources only while none of them has been read)."""

    def __init__(self, source: AsyncSource, progress: Progress | None = None) -> None:
        self._async = inspect.iscoroutinefunction(getattr(source, "read", None)) or isinstance(source, AsyncIterable)
        self._source = source
        self._progress = progress
        self._sync = None if self._async else Body(cast(Source, source), progress)
        self._started = False

    @property
    def replayable(self) -> bool:
        return self._sync.replayable if self._sync is not None else not self._started

    async def chunks(self) -> AsyncIterator[bytes]:
        if self._sync is not None:
            async for chunk in from_thread(self._sync.chunks()):
                yield chunk
            return
        async for chunk in _async_chunks(self._source):
            self._started = True
            if self._progress is not None:
                self._progress.sent(len(chunk))
            yield chunk


async def _async_chunks(source: Any) -> AsyncIterator[bytes]:
    read = getattr(source, "read", None)
    if inspect.iscoroutinefunction(read):
        while chunk := await read(protocol.CHUNK):
            yield bytes(chunk)
    else:
        async for chunk in source:
            if chunk:
                yield bytes(chunk)


async def awrite_sink(sink: Any, data: bytes) -> None:
    """Write to an async writer (awaiting ``write``, or ``drain`` after it) or a sync sink."""
    write = getattr(sink, "write", None)
    if inspect.iscoroutinefunction(write):
        await write(data)
    elif inspect.iscoroutinefunction(getattr(sink, "drain", None)):
        sink.write(data)
        await sink.drain()
    else:
        write_sink(sink, data)


async def aflush_sink(sink: Any) -> None:
    if inspect.iscoroutinefunction(getattr(sink, "flush", None)):
        await sink.flush()
    elif not inspect.iscoroutinefunction(getattr(sink, "drain", None)):
        flush_sink(sink)


class AsyncCascadeClient(ClientBase[httpx.AsyncClient]):
    """The async ``CascadeClient``: same methods, arguments, results and exceptions, awaited.

    ``async with AsyncCascadeClient(url, key) as client: stats = await client.compress_to(dst, src)``.
    """

    def __init__(self, server: str | None = None, api_key: str | None = None, timeout: float = 3600,
                 *, duplex: bool = True, transport: httpx.AsyncBaseTransport | None = None,
                 retry: RetryPolicy | None = None) -> None:
        options = client_options(server, api_key, timeout)
        http = httpx.AsyncClient(transport=transport or AsyncDuplexTransport(), **options)
        super().__init__(http, duplex, retry)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncCascadeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _chunks(self, call: StreamCall[Any], source: AsyncSource,
                      progress: Progress | None) -> AsyncIterator[bytes]:
        """Upload ``source`` as the body (again, on a retry, when it can be replayed); yield each
        decoded reply chunk as it arrives. A stream that breaks once started is an error."""
        body = AsyncBody(source, progress)

        def build() -> httpx.Request:
            return self._http.build_request(**request_args(call.request, duplex=self._duplex, content=body.chunks()))

        with transport_errors(self.server):
            response = await asend(self._http, build, self._retry, lambda: body.replayable)
        try:
            async for sse in EventSource(response).aiter_sse():
                data = call.feed(protocol.event_from_sse(sse.event, sse.data))
                if data:
                    if progress is not None:
                        progress.received(len(data))
                    yield data
        except httpx.TransportError as exc:
            raise broken_stream(self.server, exc) from exc
        finally:
            await response.aclose()

    async def _stream(self, call: StreamCall[R], sink: AsyncSink, source: AsyncSource,
                      progress: Progress | None) -> R:
        async for data in self._chunks(call, source, progress):
            await awrite_sink(sink, data)
        await aflush_sink(sink)
        return call.finish()

    async def _iter(self, call: StreamCall[Any], source: AsyncSource) -> AsyncIterator[bytes]:
        async for data in self._chunks(call, source, None):
            yield data
        call.finish()  # raises if the stream was cut short

    async def _json(self, call: JsonCall[R]) -> R:
        """Drive a protocol JSON exchange: send each request it yields, hand it the reply."""
        with transport_errors(self.server):
            return await adrive(self._http, call, self._retry)

    async def compress_to(self, sink: AsyncSink, source: AsyncSource, *, progress: Progress | None = None,
                          concurrency: int | None = None, piece_bytes: int = DEFAULT_PIECE_BYTES,
                          **options: Any) -> CompressStats:
        """Compress ``source`` into a container written to ``sink`` chunk by chunk (options as sync).

        ``concurrency``: cut the input into pieces of about ``piece_bytes`` and compress that many
        at once (through a balancer, on several replicas); the pieces' containers are spliced into
        one (``cascade_client.spread``)."""
        check_endpoints(sink, source)
        if concurrency is None:
            return await self._stream(protocol.compress_call(**options), sink, source, progress)
        stats = await compress_spread(self, AsyncBody(source).chunks(), functools.partial(awrite_sink, sink),
                                      piece_bytes=piece_bytes, concurrency=concurrency, progress=progress, **options)
        await aflush_sink(sink)
        return stats

    async def decompress_to(self, sink: AsyncSink, source: AsyncSource, *, progress: Progress | None = None,
                            concurrency: int | None = None, piece_bytes: int = DEFAULT_PIECE_BYTES) -> DecompressStats:
        """Decompress the container in ``source``; each verified segment is written to ``sink``.
        ``concurrency``: decompress that many groups of whole segments at once (see ``compress_to``)."""
        check_endpoints(sink, source)
        if concurrency is None:
            return await self._stream(protocol.decompress_call(), sink, source, progress)
        stats = await decompress_spread(self, AsyncBody(source).chunks(), functools.partial(awrite_sink, sink),
                                        piece_bytes=piece_bytes, concurrency=concurrency, progress=progress)
        await aflush_sink(sink)
        return stats

    async def compress(self, data: AsyncSource, **options: Any) -> bytes:
        out = io.BytesIO()
        await self.compress_to(out, data, **options)
        return out.getvalue()

    async def decompress(self, container: AsyncSource) -> bytes:
        out = io.BytesIO()
        await self.decompress_to(out, container)
        return out.getvalue()

    def iter_compress(self, source: AsyncSource, **options: Any) -> AsyncIterator[bytes]:
        """The container as an async iterator of chunks (``async for chunk in client.iter_compress(f)``)."""
        return self._iter(protocol.compress_call(**options), source)

    def iter_decompress(self, source: AsyncSource) -> AsyncIterator[bytes]:
        return self._iter(protocol.decompress_call(), source)

    async def kcbs(self, prompt: str, beam_width: int, steps: int, **params: Any) -> KcbsResult:
        """Top-k-constrained beam search (parameters as ``CascadeClient.kcbs``)."""
        return await self._json(protocol.kcbs_call(prompt, beam_width, steps, **params))

    async def export_topk(self, prompt: str | Sequence[int], compression_top_k: int = 100,
                          **sampling: Any) -> TopkDocument:
        """One prompt's top-k distributions (parameters as ``CascadeClient.export_topk``)."""
        return await self._json(protocol.export_topk_call(prompt, compression_top_k, **sampling))

    async def export_topk_to(self, sink: Sink, sources: Sequence[str | Path], compression_top_k: int = 100, *,
                             progress: Progress | None = None, **options: Any) -> ExportStats:
        """Export files and directories to ``sink`` (options as ``CascadeClient.export_topk_to``)."""
        with transport_errors(self.server):
            return await TopkExporter(self._http, compression_top_k, retry=self._retry, **options).run(
                sources, sink, progress)
