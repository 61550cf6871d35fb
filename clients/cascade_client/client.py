"""Sync client (httpx.Client): streaming codec calls between file-likes/sockets, and k-CBS.

What goes over the wire is decided in ``protocol`` (shared with ``AsyncCascadeClient``); this
module only moves bytes. Codec uploads are full duplex (see ``duplex``): the reply is read while
the body is still being sent, so inputs of any size stream through in constant memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
from httpx_sse import EventSource

from cascade_client import protocol
from cascade_client._http import (
    ClientBase,
    broken_stream,
    client_options,
    drive,
    request_args,
    send,
    transport_errors,
)
from cascade_client._io import Body, Sink, Source, check_endpoints, flush_sink, write_sink
from cascade_client.aio import AsyncCascadeClient
from cascade_client.duplex import SyncDuplexTransport
from cascade_client.protocol import (
    CascadeError,
    CompressStats,
    DecompressStats,
    JsonCall,
    KcbsResult,
    Progress,
    StreamCall,
)
from cascade_client.retry import RetryPolicy
from cascade_client.spread import DEFAULT_PIECE_BYTES
from cascade_client.topk_document import TopkDocument
from cascade_client.topk_export import ExportStats, TopkExporter

__all__ = ["CascadeClient", "CascadeError", "CompressStats", "DecompressStats", "ExportStats", "KcbsResult",
           "TopkDocument"]

R = TypeVar("R")


class CascadeClient(ClientBase[httpx.Client]):
    """``compress_to``/``decompress_to`` stream between a source and a sink, never holding a whole
    file; ``compress``/``decompress`` are the in-memory conveniences; ``kcbs`` runs a beam search;
    ``export_topk`` returns one prompt's top-k distributions, ``export_topk_to`` streams a corpus's.

    Every failure raises a ``CascadeError`` subclass carrying the server's status, message, type
    and code (``CascadeConnectionError`` when the server cannot be reached or a stream was cut).
    ``retry`` says what is sent again (default ``RetryPolicy()``: 429/503 after their
    ``Retry-After``, a balancer's 502, and connections that failed before any byte of the answer,
    5 attempts within 60 s; ``RetryPolicy.none()`` never retries). ``duplex=False`` sends the whole body before
    reading the reply (plain httpx; only safe for inputs of a few MB).
    """

    def __init__(self, server: str | None = None, api_key: str | None = None, timeout: float = 3600,
                 *, duplex: bool = True, transport: httpx.BaseTransport | None = None,
                 retry: RetryPolicy | None = None) -> None:
        self._options = client_options(server, api_key, timeout)
        self._args = (server, api_key, timeout)
        http = httpx.Client(transport=transport or SyncDuplexTransport(), **self._options)
        super().__init__(http, duplex, retry)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> CascadeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _chunks(self, call: StreamCall[Any], source: Source, progress: Progress | None) -> Iterator[bytes]:
        """Upload ``source`` as the body (again, on a retry, when it can be replayed); yield each
        decoded reply chunk as it arrives. A stream that breaks once started is an error."""
        body = Body(source, progress)

        def build() -> httpx.Request:
            return self._http.build_request(**request_args(call.request, duplex=self._duplex, content=body.chunks()))

        with transport_errors(self.server):
            response = send(self._http, build, self._retry, lambda: body.replayable)
        with contextlib.closing(response):
            try:
                for sse in EventSource(response).iter_sse():
                    data = call.feed(protocol.event_from_sse(sse.event, sse.data))
                    if data:
                        if progress is not None:
                            progress.received(len(data))
                        yield data
            except httpx.TransportError as exc:
                raise broken_stream(self.server, exc) from exc

    def _stream(self, call: StreamCall[R], sink: Sink, source: Source, progress: Progress | None) -> R:
        for data in self._chunks(call, source, progress):
            write_sink(sink, data)
        flush_sink(sink)
        return call.finish()

    def _iter(self, call: StreamCall[Any], source: Source) -> Iterator[bytes]:
        yield from self._chunks(call, source, None)
        call.finish()  # raises if the stream was cut short

    def _json(self, call: JsonCall[R]) -> R:
        """Drive a protocol JSON exchange: send each request it yields, hand it the reply."""
        with transport_errors(self.server):
            return drive(self._http, call, self._retry)

    def compress_to(self, sink: Sink, source: Source, *, progress: Progress | None = None,
                    concurrency: int | None = None, piece_bytes: int = DEFAULT_PIECE_BYTES,
                    **options: Any) -> CompressStats:
        """Compress ``source`` into a container written to ``sink`` chunk by chunk.

        ``options``: ``top_k``, ``precision_bits`` (16/24/32), ``lane_tokens``, ``lanes``, ``context``,
        ``verify`` (decode every segment on the server before answering), ``model``.
        ``concurrency``: spread the input over the replicas behind a balancer — cut it into pieces of
        about ``piece_bytes``, compress that many at once, splice their containers into one
        (``cascade_client.spread``; the container depends on ``piece_bytes`` only).
        """
        check_endpoints(sink, source)
        if concurrency is None:
            return self._stream(protocol.compress_call(**options), sink, source, progress)
        return self._spread(lambda client: client.compress_to(sink, source, progress=progress, concurrency=concurrency,
                                                              piece_bytes=piece_bytes, **options))

    def decompress_to(self, sink: Sink, source: Source, *, progress: Progress | None = None,
                      concurrency: int | None = None, piece_bytes: int = DEFAULT_PIECE_BYTES) -> DecompressStats:
        """Decompress the container in ``source``; each verified segment is written to ``sink``.
        ``concurrency``: decompress that many groups of whole segments at once, in order."""
        check_endpoints(sink, source)
        if concurrency is None:
            return self._stream(protocol.decompress_call(), sink, source, progress)
        return self._spread(lambda client: client.decompress_to(sink, source, progress=progress,
                                                                concurrency=concurrency, piece_bytes=piece_bytes))

    def _spread(self, run: Callable[[AsyncCascadeClient], Awaitable[R]]) -> R:
        """Run a spread call on the async client (concurrent pieces), on a private event loop."""
        async def main() -> R:
            async with AsyncCascadeClient(*self._args, duplex=self._duplex, retry=self._retry) as client:
                return await run(client)

        return asyncio.run(main())

    def compress(self, data: Source, **options: Any) -> bytes:
        """The whole container in memory (use ``compress_to`` or ``iter_compress`` for large inputs)."""
        out = io.BytesIO()
        self.compress_to(out, data, **options)
        return out.getvalue()

    def decompress(self, container: Source) -> bytes:
        out = io.BytesIO()
        self.decompress_to(out, container)
        return out.getvalue()

    def iter_compress(self, source: Source, **options: Any) -> Iterator[bytes]:
        """The container as an iterator of chunks, each yielded as the server sends it."""
        return self._iter(protocol.compress_call(**options), source)

    def iter_decompress(self, source: Source) -> Iterator[bytes]:
        """The original bytes as an iterator of verified segments."""
        return self._iter(protocol.decompress_call(), source)

    def kcbs(self, prompt: str, beam_width: int, steps: int, **params: Any) -> KcbsResult:
        """Top-k-constrained beam search; ``params``: ``target``, ``max_edit_distance``, ``eos``,
        ``final_prune``, ``temperature``, ``model`` (default: the served model)."""
        return self._json(protocol.kcbs_call(prompt, beam_width, steps, **params))

    def export_topk(self, prompt: str | Sequence[int], compression_top_k: int = 100, **sampling: Any) -> TopkDocument:
        """Every position's processed, renormalised top-k for one prompt (text or token ids), as
        arrays: ``targets[n]``, ``ids[n, k]``, ``logprobs[n, k]`` (record ``i`` is token ``i + 1``).

        ``compression_top_k`` is the export's K (candidates kept per position), named as on the
        HTTP API; ``sampling`` is the sampling stack, also named as there: ``temperature``,
        ``top_p``, ``top_k`` (the sampler's top-k), ``min_p``, ``logit_bias``,
        ``allowed_token_ids``, ``bad_words``, ``model``.
        """
        return self._json(protocol.export_topk_call(prompt, compression_top_k, **sampling))

    def export_topk_to(self, sink: Sink, sources: Sequence[str | Path], compression_top_k: int = 100, *,
                       progress: Progress | None = None, **options: Any) -> ExportStats:
        """Export files and directories to ``sink`` in the binary layout, never holding the corpus.

        ``options``: ``window`` (tokens per request; default the model length), ``overlap`` (context
        tokens repeated from the previous window), ``concurrency``, ``model``, and ``sampling`` (a dict
        as for ``export_topk``). Runs the async exporter on its own event loop.
        """
        async def run() -> ExportStats:
            async with httpx.AsyncClient(**self._options) as http:
                return await TopkExporter(http, compression_top_k, retry=self._retry, **options).run(
                    sources, sink, progress)

        with transport_errors(self.server):
            return asyncio.run(run())
