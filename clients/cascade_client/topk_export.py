"""Export a corpus as teacher-forced top-k distributions, streamed to a binary file.

Files are read in line-aligned pieces, tokenised by the server (``/v1/tokenize``), cut into
windows that fit the model (each window after the first starts with ``overlap`` tokens of
context whose positions are not exported again), and sent as concurrent ``compression`` requests.
Results are written in corpus order through a bounded window of in-flight requests, so memory
stays flat however large the corpus is. Layout: ``cascade_common.topk_format``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from cascade_common.ordered import ordered
from cascade_common.topk_format import Header, encode_header

from cascade_client._http import adrive
from cascade_client._io import Sink, write_sink
from cascade_client.protocol import CascadeError, Progress, default_model, export_call, tokenize_call
from cascade_client.retry import RetryPolicy
from cascade_client.topk_document import encode_arrays

PIECE_BYTES = 1 << 16
MAX_PIECE_FACTOR = 16
_WHITESPACE = {b" ", b"\t", b"\r", b"\n", b"\f", b"\v"}


@dataclass
class ExportStats:
    """What ``cascade export-topk`` reports: input read, positions written, requests made."""

    files: int = 0
    bytes_read: int = 0
    tokens: int = 0
    positions: int = 0
    requests: int = 0
    output_bytes: int = 0
    skipped: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Window:
    """File tokens ``tokens`` start at file index ``first``; records from file index ``export_from`` on."""

    name: str
    first: int
    export_from: int
    tokens: list[int]


def iter_sources(paths: Sequence[str | Path]) -> Iterator[Path]:
    """Files in a stable order: each path as given, directories recursively and sorted."""
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*") if p.is_file())
        else:
            yield path


def read_pieces(path: Path, piece_bytes: int = PIECE_BYTES) -> Iterator[bytes]:
    """About ``piece_bytes``-sized reads, each ending just before a line that starts with a
    non-whitespace byte, so that tokenising the pieces one by one gives the whole file's tokens.

    Byte-level BPE pre-tokenisers (GPT-2's regex) never join a token across the boundary between a
    newline and a following non-space character; they do join whitespace runs (a blank line, a
    newline and the next line's indentation), so a cut after any newline can split a token. A file with no such
    line for ``MAX_PIECE_FACTOR`` pieces is cut at a newline anyway (positions may then shift)."""
    with path.open("rb") as handle:
        carry = b""
        while True:
            piece = carry + handle.read(max(piece_bytes - len(carry), 0))
            carry = b""
            if not piece:
                return
            if not piece.endswith(b"\n"):
                piece += handle.readline()
            while len(piece) < piece_bytes * MAX_PIECE_FACTOR:
                line = handle.readline()
                if not line or line[:1] not in _WHITESPACE:
                    carry = line
                    break
                piece += line
            yield piece


class Windower:
    """Cuts one file's token stream into windows of at most ``window`` tokens, as tokens arrive.

    Each window after the first starts with ``overlap`` (at least one) already-exported tokens as
    context. Only the tokens not yet exported, plus that context, are kept."""

    def __init__(self, name: str, window: int, overlap: int) -> None:
        if not 0 <= overlap < window - 1:
            raise ValueError("overlap must be smaller than window - 1")
        self.name, self.window = name, window
        self.context = max(overlap, 1)
        self.buffer: list[int] = []
        self.base = 0
        self.export_from = 0

    def push(self, tokens: Sequence[int]) -> list[Window]:
        self.buffer.extend(tokens)
        return self._take(final=False)

    def finish(self) -> list[Window]:
        return self._take(final=True)

    def _take(self, final: bool) -> list[Window]:
        out: list[Window] = []
        while True:
            first = max(0, self.export_from - self.context)
            end = first + self.window
            available = self.base + len(self.buffer)
            if end > available:
                if not final or available - max(self.export_from, 1) <= 0:
                    return out
                end = available
            out.append(Window(self.name, first, max(self.export_from, 1),
                              self.buffer[first - self.base: end - self.base]))
            self.export_from = end
            drop = max(0, end - self.context) - self.base
            self.buffer, self.base = self.buffer[drop:], self.base + drop
            if end == available:
                return out


class TopkExporter:
    """Drives one export over an ``httpx.AsyncClient`` that already has the base URL and auth."""

    def __init__(self, http: httpx.AsyncClient, compression_top_k: int = 100, *, model: str | None = None,
                 window: int | None = None, overlap: int = 64, concurrency: int = 4,
                 sampling: dict[str, Any] | None = None, retry: RetryPolicy | None = None) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.http, self.model, self.compression_top_k = http, model or "", compression_top_k
        self.retry = retry if retry is not None else RetryPolicy()
        self.window, self.overlap, self.concurrency = window, overlap, concurrency
        self.sampling = sampling or {}

    async def _tokens(self, piece: bytes, path: Path) -> tuple[list[int], int]:
        try:
            text = piece.decode("utf-8")
        except UnicodeDecodeError:
            raise CascadeError(0, f"{path} is not UTF-8 text") from None
        return await adrive(self.http, tokenize_call(text, model=self.model), self.retry)

    async def _export(self, item: Window) -> tuple[Header, bytes]:
        call = export_call(item.tokens, self.compression_top_k, model=self.model, **self.sampling)
        header, document = await adrive(self.http, call, self.retry)
        skip = item.export_from - (item.first + 1)
        return header, encode_arrays(item.name, item.export_from, self.compression_top_k, document.targets[skip:],
                                     document.ids[skip:], document.logprobs[skip:])

    async def _windows(self, sources: Sequence[str | Path], stats: ExportStats,
                       progress: Progress | None) -> AsyncIterator[Window]:
        for path in iter_sources(sources):
            stats.files += 1
            windower: Windower | None = None
            for piece in read_pieces(path):
                tokens, max_len = await self._tokens(piece, path)
                stats.bytes_read += len(piece)
                stats.tokens += len(tokens)
                if progress is not None:
                    progress.sent(len(piece))
                if windower is None:
                    windower = Windower(str(path), self.window or max_len - 1, self.overlap)
                for item in windower.push(tokens):
                    yield item
            for item in windower.finish() if windower is not None else []:
                yield item

    async def run(self, sources: Sequence[str | Path], sink: Sink,
                  progress: Progress | None = None) -> ExportStats:
        """Write the header and every window's records to ``sink`` in corpus order.

        ``progress.sent`` counts input bytes as they are tokenised, ``progress.received`` output
        bytes as they are written. The header is the server's (it names the vocabulary size).
        """
        stats = ExportStats()
        if not self.model:
            self.model = await adrive(self.http, default_model(), self.retry)
        wrote_header = False

        async def jobs() -> AsyncIterator[Callable[[], Awaitable[tuple[Header, bytes]]]]:
            async for item in self._windows(sources, stats, progress):
                stats.requests += 1
                stats.positions += len(item.tokens) - (item.export_from - item.first)
                yield functools.partial(self._export, item)

        async with contextlib.aclosing(ordered(jobs(), self.concurrency)) as results:
            async for header, records in results:
                if not wrote_header:
                    stats.output_bytes += _write(sink, encode_header(header.k, header.vocab_size), None)
                    wrote_header = True
                stats.output_bytes += _write(sink, records, progress)
        if not wrote_header:
            stats.output_bytes += _write(sink, encode_header(self.compression_top_k, 0), None)
        return stats


def _write(sink: Sink, data: bytes, progress: Progress | None) -> int:
    write_sink(sink, data)
    if progress is not None:
        progress.received(len(data))
    return len(data)
