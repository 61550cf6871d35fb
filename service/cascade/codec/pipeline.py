"""Compress and decompress as streams: segments in order, container bytes out as soon as final.

This is the codec's orchestration (no HTTP): it owns the segmenter, the container writer/reader
and the engine adapter, checks every decoded segment against its CRC, and reports statistics.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from cascade.codec.container import (
    KIND_CODED,
    KIND_RAW,
    ContainerError,
    ContainerReader,
    ContainerWriter,
    Header,
    Limits,
    SegmentRecord,
)
from cascade.codec.engine_codec import EngineCodec
from cascade.codec.segmenter import Segment, Segmenter

if TYPE_CHECKING:
    from cascade.engine.manager import EngineManager

T = TypeVar("T")
SELF_TEST_TEXT = ('import os\n\n\ndef read_config(path):\n    """Read a key=value file into a dict."""\n'
                  "    result = {}\n    with open(path) as handle:\n        for line in handle:\n"
                  "            key, _, value = line.partition('=')\n            result[key.strip()] = value.strip()\n"
                  "    return result\n")


class CodecUnavailableError(RuntimeError):
    """The codec cannot serve (disabled, engine starting, or the determinism self-test failed)."""


class ModelMismatchError(ValueError):
    """The container was made with another model (fingerprints differ)."""


class IntegrityError(ValueError):
    """A decoded segment does not match its recorded checksum: nothing wrong is returned."""


class SegmentResult(NamedTuple):
    """A segment ready for ``ContainerWriter.segment_bytes``."""

    kind: int
    tokens: int
    original: bytes
    payload: bytes


@dataclass(frozen=True)
class CompressOptions:
    top_k: int
    precision_bits: int
    segment_tokens: int
    context: bytes = b""
    verify: bool = False


@dataclass
class CompressStats:
    bytes_in: int = 0
    bytes_out: int = 0
    tokens: int = 0
    payload_bits: int = 0
    ideal_bits: float = 0.0
    segments: int = 0
    raw_segments: int = 0
    seconds: float = 0.0
    started: float = field(default_factory=time.monotonic)

    def as_dict(self) -> dict[str, Any]:
        self.seconds = time.monotonic() - self.started
        return {"bytes_in": self.bytes_in, "bytes_out": self.bytes_out, "tokens": self.tokens,
                "segments": self.segments, "raw_segments": self.raw_segments,
                "bits_per_token": self.payload_bits / self.tokens if self.tokens else 0.0,
                "bits_per_byte": 8 * self.bytes_out / self.bytes_in if self.bytes_in else 0.0,
                "ideal_bits_per_token": self.ideal_bits / self.tokens if self.tokens else 0.0,
                "compression_ratio": self.bytes_in / self.bytes_out if self.bytes_out else 0.0,
                "seconds": round(self.seconds, 4)}


async def ordered(jobs: AsyncIterator[Callable[[], Awaitable[T]]], window: int) -> AsyncIterator[T]:
    """Run up to ``window`` jobs at once, yielding results in submission order."""
    pending: list[asyncio.Task[T]] = []
    try:
        async for job in jobs:
            pending.append(asyncio.ensure_future(job()))
            while len(pending) >= window:
                yield await pending.pop(0)
        while pending:
            yield await pending.pop(0)
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


class CodecPipeline:
    """One per service: knows the model (tokenizer, fingerprint) and drives the codec engine."""

    def __init__(self, engines: EngineManager, dtype: str, max_model_len: int, window: int,
                 limits: Limits | None = None) -> None:
        self.engines = engines
        self.dtype = dtype
        self.max_model_len = max_model_len
        self.window = max(1, window)
        self.limits = limits or Limits()
        self.unavailable_reason: str | None = "codec engine is starting"

    @property
    def tokenizer(self) -> Any:
        return self.engines.tokenizer

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def _engine_codec(self) -> EngineCodec:
        eos = self.tokenizer.eos_token_id
        return EngineCodec(self.engines, self.vocab_size, 0 if eos is None else int(eos))

    def encode_text(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode_tokens(self, tokens: list[int]) -> str:
        return str(self.tokenizer.decode(tokens, skip_special_tokens=False, clean_up_tokenization_spaces=False))

    def check_available(self) -> None:
        if self.unavailable_reason is not None:
            raise CodecUnavailableError(self.unavailable_reason)

    def context_tokens(self, context: bytes) -> list[int]:
        return self.encode_text(context.decode("utf-8")) if context else []

    def max_segment_tokens(self, context_tokens: int) -> int:
        return self.max_model_len - 2 - context_tokens

    async def compress(self, chunks: AsyncIterator[bytes], options: CompressOptions, stats: CompressStats,
                       request_id: str, *, self_test: bool = False) -> AsyncIterator[bytes]:
        """Container bytes, header first; each segment's record as soon as it is coded."""
        if not self_test:
            self.check_available()
        context = self.context_tokens(options.context)
        limit = min(options.segment_tokens, self.max_segment_tokens(len(context)))
        segmenter = Segmenter(self.encode_text, self.decode_tokens, limit, target_bytes=limit * 3)
        codec = self._engine_codec()
        writer = ContainerWriter(Header(self.engines.fingerprint, options.precision_bits, options.top_k,
                                        self.vocab_size, self.dtype, {"separator_id": codec.separator_id},
                                        options.context))
        header = writer.header_bytes()
        stats.bytes_out += len(header)
        yield header

        async def jobs() -> AsyncIterator[Callable[[], Awaitable[SegmentResult]]]:
            index = 0
            async for segment in segmenter.segments(counted(chunks, stats)):
                yield self._segment_job(codec, segment, context, options, stats, f"{request_id}-c{index}")
                index += 1

        async for coded in ordered(jobs(), self.window):
            record = writer.segment_bytes(*coded)
            stats.bytes_out += len(record)
            yield record
        trailer = writer.trailer_bytes()
        stats.bytes_out += len(trailer)
        yield trailer

    def _segment_job(self, codec: EngineCodec, segment: Segment, context: list[int], options: CompressOptions,
                     stats: CompressStats, rid: str) -> Callable[[], Awaitable[SegmentResult]]:
        """Jobs finish in any order; only their results go through the writer, in submission order,
        because the container's running CRC covers the records in the order they are written."""
        async def run() -> SegmentResult:
            if segment.tokens is None:
                stats.raw_segments += 1
                stats.segments += 1
                return SegmentResult(KIND_RAW, 0, segment.data, segment.data)
            coded = await codec.encode(segment.tokens, context, options.top_k, options.precision_bits, rid)
            if options.verify:
                back = await codec.decode(coded.payload, coded.tokens, context, options.top_k,
                                          options.precision_bits, rid + "-verify")
                if back != segment.tokens:
                    raise IntegrityError(f"verification failed: segment {stats.segments} did not decode back; "
                                         "the engine is not deterministic here")
            stats.tokens += coded.tokens
            stats.payload_bits += 8 * len(coded.payload)
            stats.ideal_bits += coded.ideal_bits
            stats.segments += 1
            return SegmentResult(KIND_CODED, coded.tokens, segment.data, coded.payload)

        return run

    async def decompress(self, chunks: AsyncIterator[bytes], request_id: str, *,
                         self_test: bool = False) -> AsyncIterator[tuple[int, bytes]]:
        """(segment index, original bytes) in order; every segment is CRC-verified before it is yielded."""
        if not self_test:
            self.check_available()
        reader = ContainerReader(self.limits)
        codec = self._engine_codec()
        header: Header | None = None
        context: list[int] = []

        async def jobs() -> AsyncIterator[Callable[[], Awaitable[tuple[int, bytes]]]]:
            nonlocal header, context
            async for chunk in chunks:
                for item in reader.feed(chunk):
                    if isinstance(item, Header):
                        header = item
                        self._check_header(item)
                        context = self.context_tokens(item.context)
                    elif isinstance(item, SegmentRecord):
                        assert header is not None
                        yield self._decode_job(codec, header, item, context, f"{request_id}-d{item.index}")
            reader.close()

        async for result in ordered(jobs(), self.window):
            yield result

    def _check_header(self, header: Header) -> None:
        if header.fingerprint != self.engines.fingerprint:
            raise ModelMismatchError(
                f"container was made with model fingerprint {header.fingerprint.hex()[:16]}…, this server runs "
                f"{self.engines.fingerprint.hex()[:16]}…: decompress it with the same model")
        if header.vocab_size != self.vocab_size:
            raise ModelMismatchError(f"container vocabulary {header.vocab_size} ≠ model vocabulary {self.vocab_size}")
        try:
            header.context.decode("utf-8")
        except UnicodeDecodeError:
            raise ContainerError("corrupted header: context is not UTF-8") from None

    def _decode_job(self, codec: EngineCodec, header: Header, record: SegmentRecord, context: list[int],
                    rid: str) -> Callable[[], Awaitable[tuple[int, bytes]]]:
        async def run() -> tuple[int, bytes]:
            if record.kind == KIND_RAW:
                data = record.payload
            else:
                if record.tokens < 1 or record.tokens > self.max_segment_tokens(len(context)):
                    raise ContainerError(f"corrupted container: segment {record.index} declares "
                                         f"{record.tokens} tokens")
                tokens = await codec.decode(record.payload, record.tokens, context, header.top_k,
                                            header.precision_bits, rid)
                data = self.decode_tokens(tokens).encode("utf-8")
            if len(data) != record.original_length or zlib.crc32(data) != record.crc32:
                raise IntegrityError(f"segment {record.index} failed its checksum after decoding: the container is "
                                     "damaged or was made under different numerics; no output was produced for it")
            return record.index, data

        return run

    async def self_test(self, inject_fault: bool = False) -> None:
        """Round-trip a sample through the codec engine; on failure the codec answers 503 with the reason."""
        self.unavailable_reason = "the codec's startup self-test is running"
        try:
            options = CompressOptions(top_k=64, precision_bits=32, segment_tokens=512)
            stats = CompressStats()

            async def source() -> AsyncIterator[bytes]:
                yield SELF_TEST_TEXT.encode()

            container = b"".join([part async for part in self.compress(source(), options, stats, "selftest",
                                                                               self_test=True)])
            if inject_fault:
                damaged = bytearray(container)
                damaged[-40] ^= 0x10
                container = bytes(damaged)

            async def packed() -> AsyncIterator[bytes]:
                yield container

            decoded = b"".join([data async for _, data in self.decompress(packed(), "selftest", self_test=True)])
            if decoded != SELF_TEST_TEXT.encode():
                raise IntegrityError("self-test text did not round-trip")
            self.unavailable_reason = None
        except (IntegrityError, ContainerError, RuntimeError) as exc:
            self.unavailable_reason = (f"codec disabled: the startup self-test found the engine's distributions are "
                                       f"not reproducible here ({exc})")


async def counted(chunks: AsyncIterator[bytes], stats: CompressStats) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        stats.bytes_in += len(chunk)
        yield chunk
