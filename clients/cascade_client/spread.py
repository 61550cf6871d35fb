"""One large input spread over several replicas: pieces coded concurrently, one container out.

Compression cuts the input into pieces (``framing.cut``: about ``piece_bytes`` each, at a line end),
compresses up to ``concurrency`` of them at once (through a balancer, each request may land on
another replica) and splices their containers, in order, into one ordinary container
(``framing.Splicer``). Decompression walks a container's records, groups whole segments into
standalone containers of about ``piece_bytes`` of original text, decompresses up to
``concurrency`` at once and writes their text in order. Only ``concurrency`` pieces are held at a
time, so inputs of any size go through in bounded memory.

The pieces share one lane plan: a server plans lanes per input (a small one gets shorter lanes, and the
header records the plan), so unless ``lane_tokens`` is given the first piece is sent as is and every
other piece with the ``lane_tokens`` its header shows, as soon as that header arrives.

A container depends on the input and ``piece_bytes`` only — not on ``concurrency``, nor on which
replica coded which piece (every replica computes the same integers) — and it decompresses the same
whether spread or sent whole. It differs from the container a single ``/compress`` stream makes of
the same input (segments are cut at other places), and both decode to the same bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from cascade_common.ordered import ordered

from cascade_client.framing import Record, Splicer, Walker, cut, header_lane_tokens, standalone
from cascade_client.protocol import CascadeError, CompressStats, DecompressStats, Progress

DEFAULT_PIECE_BYTES = 1 << 20
MIN_PIECE_BYTES = 64


class Coder(Protocol):
    """What spreading needs of a client: calls on whole pieces (bytes bodies are replayed on a retry)."""

    async def compress_to(self, sink: Any, source: Any, **options: Any) -> CompressStats: ...

    async def decompress(self, container: Any) -> bytes: ...


async def pieces(chunks: AsyncIterator[bytes], piece_bytes: int) -> AsyncIterator[bytes]:
    """The input cut into pieces (``framing.cut``); an empty input is one empty piece."""
    buffer = bytearray()
    sent = False
    async for chunk in chunks:
        buffer += chunk
        while len(buffer) > piece_bytes:
            end = cut(buffer, piece_bytes)
            yield bytes(buffer[:end])
            del buffer[:end]
            sent = True
    if buffer or not sent:
        yield bytes(buffer)


async def compress_spread(coder: Coder, chunks: AsyncIterator[bytes], write: Callable[[bytes], Awaitable[None]], *,
                          piece_bytes: int, concurrency: int, progress: Progress | None = None,
                          **options: Any) -> CompressStats:
    """Compress ``chunks`` piece by piece, ``concurrency`` pieces at a time; ``write`` gets the
    container in order. The statistics are the pieces' summed (``seconds``: wall time)."""
    _check(piece_bytes, concurrency)
    started = time.monotonic()
    splicer = Splicer()
    bytes_in = tokens = raw_segments = 0

    plan: asyncio.Future[int] | None = None
    if options.get("lane_tokens") is None:
        plan = asyncio.get_running_loop().create_future()

    async def job(piece: bytes, first: bool) -> tuple[bytes, CompressStats]:
        out: io.BytesIO = _PlanWatch(plan) if first and plan is not None else io.BytesIO()
        chosen = options if first or plan is None else {**options, "lane_tokens": await plan}
        try:
            stats = await coder.compress_to(out, piece, **chosen)
        finally:
            if first and plan is not None and not plan.done():
                plan.set_exception(CascadeError(0, "the first piece failed before its lane plan was known"))
        if progress is not None:
            progress.sent(len(piece))
        return out.getvalue(), stats

    async def jobs() -> AsyncIterator[Callable[[], Awaitable[tuple[bytes, CompressStats]]]]:
        first = True
        async for piece in pieces(chunks, piece_bytes):
            yield functools.partial(job, piece, first)
            first = False

    async with contextlib.aclosing(ordered(jobs(), concurrency)) as results:
        async for container, stats in results:
            data = splicer.add(container)
            bytes_in, tokens, raw_segments = bytes_in + stats.bytes_in, tokens + stats.tokens, \
                raw_segments + stats.raw_segments
            await write(data)
            if progress is not None:
                progress.received(len(data))
    await write(splicer.finish())
    size = splicer.bytes_written
    return CompressStats(bytes_in, size, tokens, 8.0 * size / max(bytes_in, 1), time.monotonic() - started,
                         splicer.segments, raw_segments, 8.0 * size / max(tokens, 1), bytes_in / max(size, 1))


async def decompress_spread(coder: Coder, chunks: AsyncIterator[bytes], write: Callable[[bytes], Awaitable[None]], *,
                            piece_bytes: int, concurrency: int, progress: Progress | None = None) -> DecompressStats:
    """Decompress the container in ``chunks`` as standalone containers of whole segments, about
    ``piece_bytes`` of text each, ``concurrency`` at a time; ``write`` gets the text in order.
    Every segment is CRC-checked by the server that decodes it; the container's own trailer (count,
    total, whole-stream CRC) is checked here, and a container that ends early is an error."""
    _check(piece_bytes, concurrency)
    walker = Walker()
    written = 0

    async def groups() -> AsyncIterator[Callable[[], Awaitable[bytes]]]:
        group: list[Record] = []
        size = 0
        async for chunk in chunks:
            for record in walker.feed(chunk):
                if record.kind != "segment":
                    continue
                group.append(record)
                size += record.original_length
                if size >= piece_bytes:
                    yield functools.partial(coder.decompress, standalone(_header(walker), group))
                    group, size = [], 0
        walker.close()
        if group or not walker.segments:
            yield functools.partial(coder.decompress, standalone(_header(walker), group))

    async with contextlib.aclosing(ordered(groups(), concurrency)) as results:
        async for text in results:
            await write(text)
            written += len(text)
            if progress is not None:
                progress.received(len(text))
    return DecompressStats(written, walker.segments, True)


class _PlanWatch(io.BytesIO):
    """The first piece's container: resolves ``plan`` with its header's ``lane_tokens`` once the header is in."""

    def __init__(self, plan: asyncio.Future[int]) -> None:
        super().__init__()
        self.plan = plan
        self.walker = Walker()

    def write(self, data: Any) -> int:
        written = super().write(data)
        if not self.plan.done():
            self.walker.feed(bytes(data))
            if self.walker.header is not None:
                self.plan.set_result(header_lane_tokens(self.walker.header))
        return written


def _header(walker: Walker) -> bytes:
    assert walker.header is not None
    return walker.header


def _check(piece_bytes: int, concurrency: int) -> None:
    if piece_bytes < MIN_PIECE_BYTES or concurrency < 1:
        raise CascadeError(0, f"pieces need at least {MIN_PIECE_BYTES} bytes and a concurrency of at least 1")
