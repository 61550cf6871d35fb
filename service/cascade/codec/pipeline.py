"""Compress and decompress as streams: segments in order, container bytes out as soon as final.

This is the codec's orchestration (no HTTP): it owns the segmenter, the container writer/reader
and the exact runner (``exact.runner``), checks every decoded segment against its CRC, and reports
statistics. Every segment is conditioned only on ``[</s>] + context`` (the model's document
separator, as in training, plus the container's optional context) and cut into lanes
(``lanes``), so segments and lanes are independent: they run batched, in any grouping, and a
damaged segment never poisons the others.
"""

from __future__ import annotations

import functools
import logging
import time
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from cascade_common.ordered import ordered

from cascade.codec.container import (
    KIND_CODED,
    KIND_RAW,
    READ_VERSIONS,
    VERSION,
    ContainerError,
    ContainerReader,
    ContainerWriter,
    Header,
    Limits,
    SegmentRecord,
    check_params,
    encode_segment,
)
from cascade.codec.lanes import MAX_LANES, lane_lengths, plan_lanes, split_lanes
from cascade.codec.range_coder import PayloadOverrunError
from cascade.codec.segmenter import Segment, Segmenter

if TYPE_CHECKING:
    from cascade.codec.exact.runner import ExactRunner

logger = logging.getLogger("cascade.codec")

REFERENCE_CONTAINERS = {3: Path(__file__).with_name("exact") / "reference.cz",
                        4: Path(__file__).with_name("exact") / "reference_v4.cz"}
"""The self-test sample's container, per format version, as the reference machine wrote it for the
default model (version 3 by release ddd10e1)."""
SELF_TEST_TEXT = ('import os\n\n\ndef read_config(path):\n    """Read a key=value file into a dict."""\n'
                  "    result = {}\n    with open(path) as handle:\n        for line in handle:\n"
                  "            key, _, value = line.partition('=')\n            result[key.strip()] = value.strip()\n"
                  "    return result\n")


class CodecUnavailableError(RuntimeError):
    """The codec cannot serve (disabled, engine starting, or the determinism self-test failed)."""


class ModelMismatchError(ValueError):
    """The container was made with another model or numerics. ``code``: ``model_mismatch`` or
    ``numerics_mismatch``."""

    def __init__(self, message: str, code: str = "model_mismatch") -> None:
        super().__init__(message)
        self.code = code


class IntegrityError(ValueError):
    """A decoded segment does not match its recorded checksum, or its payload ended before its tokens:
    nothing wrong is returned. ``code``: ``checksum_mismatch`` or ``payload_overrun``."""

    def __init__(self, message: str, code: str = "checksum_mismatch") -> None:
        super().__init__(message)
        self.code = code


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
    lane_tokens: int
    lanes: int = 16
    context: bytes = b""
    verify: bool = False
    step_budget: int = 0
    """Lane plan for latency (``lanes.plan_lanes``): an input that fits one segment decodes in balanced lanes,
    toward at most this many sequential steps (0: ``lane_tokens`` and ``lanes`` as given — a request's
    explicit choice)."""
    extra_lanes: int = 0
    """Lanes the plan may add to the default plan's count to meet ``step_budget`` (each costs bits)."""


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


class CodecPipeline:
    """One per service: knows the model (tokenizer, fingerprint) and drives the exact runner.

    Whether the codec may serve is the app's to say (``lifecycle.CodecStatus``); the pipeline only
    refuses work before a runner is attached."""

    def __init__(self, max_positions: int, window: int, limits: Limits | None = None,
                 write_version: int = VERSION) -> None:
        if write_version not in READ_VERSIONS:
            raise ValueError(f"containers are written as version {' or '.join(map(str, READ_VERSIONS))}")
        self.max_positions = max_positions
        self.window = max(1, window)
        self.limits = limits or Limits()
        self.write_version = write_version
        self.runner: ExactRunner | None = None
        self._make_second_reader: Callable[[], ExactRunner] | None = None
        self._second_reader: ExactRunner | None = None
        self.numerics = ""
        self.fingerprint = b""
        self._tokenizer: Any = None

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            raise CodecUnavailableError("the codec is starting")
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        """The model's output vocabulary (what the coder codes over)."""
        return self.runner.vocab_size if self.runner is not None else len(self.tokenizer)

    @property
    def separator_id(self) -> int:
        eos = self.tokenizer.eos_token_id
        return 0 if eos is None else int(eos)

    @functools.cache  # noqa: B019 - one pipeline per service, one tokenizer per pipeline
    def tokens_are_nonempty(self) -> bool:
        """Whether every token decodes to at least one byte: then a segment cannot hold more tokens
        than bytes, and a forged token count is refused before any decoding work."""
        return all(self.decode_tokens([t]) for t in range(len(self.tokenizer)))

    def attach(self, runner: ExactRunner, numerics: str, tokenizer: Any, fingerprint: bytes,
               second_reader: Callable[[], ExactRunner] | None = None) -> None:
        """Serve with ``runner`` for the model whose tokenizer and fingerprint are given.
        ``second_reader`` makes, when first needed, a runner that computes with this machine's torch
        square root (``ExactRunner(machine_root=True)``): a segment that fails its checksum is read
        once more with it, because an earlier release on this machine may have written it that way
        (``codec.exact.root``)."""
        self.runner = runner
        self._make_second_reader = second_reader
        self.numerics = numerics
        self._tokenizer = tokenizer
        self.fingerprint = fingerprint

    def encode_text(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode_tokens(self, tokens: list[int]) -> str:
        return str(self.tokenizer.decode(tokens, skip_special_tokens=False, clean_up_tokenization_spaces=False))

    def _runner(self) -> ExactRunner:
        if self.runner is None:
            raise CodecUnavailableError("the codec is starting")
        return self.runner

    def _machine_root_reader(self) -> ExactRunner | None:
        """The second reader, or None where it could not read differently (this machine's torch root
        is the correctly rounded one) or none was given."""
        from cascade.codec.exact import root

        if self._make_second_reader is None or root.machine_is_correctly_rounded():
            return None
        if self._second_reader is None:
            self._second_reader = self._make_second_reader()
        return self._second_reader

    def close(self) -> None:
        """Stop the runners (the worker threads end; queued jobs fail)."""
        for runner in (self.runner, self._second_reader):
            if runner is not None:
                runner.close()

    def context_tokens(self, context: bytes) -> list[int]:
        return self.encode_text(context.decode("utf-8")) if context else []

    def prompt(self, context: list[int]) -> list[int]:
        return [self.separator_id, *context]

    def max_lane_tokens(self, context_tokens: int) -> int:
        """The longest lane after ``[</s>] + context`` (a lane's last token is never fed back)."""
        return self.max_positions - context_tokens

    async def encode_tokens(self, prompt: list[int], tokens: list[int], lane_tokens: int, top_k: int,
                            precision_bits: int, any_bytes: bool = False, request: object | None = None, *,
                            weighted_escapes: bool) -> tuple[bytes, float]:
        """One coded segment: ``(payload, the model's ideal bits)``. ``any_bytes``: the code is for a
        decoder that reads zeros past its end without bound (``decode_tokens_from(any_bytes=True)``,
        the codec on /v1/completions), so every trailing zero is dropped — the inverse of decoding
        arbitrary bytes gives those bytes back, as release ddd10e1 did. ``weighted_escapes``: container
        version 4 (``Header.weighted_escapes``); replay objects code escapes as version 3 did."""
        coded = await self._runner().encode(prompt, split_lanes(tokens, lane_tokens), top_k, precision_bits,
                                            request=request, weighted_escapes=weighted_escapes)
        return coded.payload.rstrip(b"\0") if any_bytes else coded.payload, coded.ideal_bits

    async def decode_tokens_from(self, prompt: list[int], payload: bytes, tokens: int, lane_tokens: int,
                                 top_k: int, precision_bits: int, any_bytes: bool = False,
                                 request: object | None = None, *, weighted_escapes: bool,
                                 runner: ExactRunner | None = None) -> list[int]:
        """``tokens`` tokens decoded from ``payload``; raises ``PayloadOverrunError`` when the payload ends
        before them, unless ``any_bytes`` (decode mode turning arbitrary bytes into text): then the
        payload is read as if followed by zeros — padded here with the most a decoder can read, 8
        bytes a token (4 per table symbol, 4 per fallback rank, as ``range >= 2**24`` after a symbol)."""
        if any_bytes:
            payload += bytes(8 * (tokens + 1))
        lanes = await (runner or self._runner()).decode(prompt, lane_lengths(tokens, lane_tokens), payload, top_k,
                                                        precision_bits, request=request,
                                                        weighted_escapes=weighted_escapes)
        return [t for lane in lanes for t in lane]

    async def compress(self, chunks: AsyncIterator[bytes], options: CompressOptions, stats: CompressStats,
                       request_id: str) -> AsyncIterator[bytes]:
        """Container bytes, header first; each segment's record as soon as it is coded."""
        request = object()  # the runner's fairness key: every segment of this request shares it
        context = self.context_tokens(options.context)
        lane_tokens = min(options.lane_tokens, self.max_lane_tokens(len(context)))
        lanes = min(options.lanes, MAX_LANES)
        target_bytes = lane_tokens * lanes * 3
        if options.step_budget:
            # The header records the lane length, so it waits until the input is known to be small (it
            # ended within one segment's bytes) or not: a small input is planned as one segment.
            head, ended, chunks = await peek(chunks, target_bytes)
            if ended:
                text_tokens = len(self.encode_text(head.decode("utf-8", "replace")))
                lane_tokens, lanes = plan_lanes(text_tokens, lane_tokens, lanes, options.step_budget,
                                                options.extra_lanes)
                target_bytes = max(target_bytes, len(head))
        segmenter = Segmenter(self.encode_text, self.decode_tokens, lane_tokens * lanes, target_bytes=target_bytes)
        writer = ContainerWriter(Header(self.fingerprint, options.precision_bits, options.top_k,
                                        self.vocab_size, self.numerics, lane_tokens,
                                        {"separator_id": self.separator_id}, options.context,
                                        version=self.write_version))
        header = writer.header_bytes()
        stats.bytes_out += len(header)
        yield header
        prompt = self.prompt(context)

        async def jobs() -> AsyncIterator[Callable[[], Awaitable[SegmentResult]]]:
            async for segment in segmenter.segments(counted(chunks, stats)):
                yield self._segment_job(segment, prompt, writer.header, options.verify, stats, request)

        async for coded in ordered(jobs(), self.window):
            record = writer.segment_bytes(*coded)
            stats.bytes_out += len(record)
            yield record
        trailer = writer.trailer_bytes()
        stats.bytes_out += len(trailer)
        yield trailer

    def _segment_job(self, segment: Segment, prompt: list[int], header: Header, verify: bool, stats: CompressStats,
                     request: object | None = None) -> Callable[[], Awaitable[SegmentResult]]:
        """Jobs finish in any order; only their results go through the writer, in submission order,
        because the container's running CRC covers the records in the order they are written. Coded
        with the coding parameters ``header`` declares."""
        async def run() -> SegmentResult:
            if segment.tokens is None:
                stats.raw_segments += 1
                stats.segments += 1
                return SegmentResult(KIND_RAW, 0, segment.data, segment.data)
            tokens = segment.tokens
            payload, ideal = await self.encode_tokens(prompt, tokens, header.lane_tokens, header.top_k,
                                                      header.precision_bits, request=request,
                                                      weighted_escapes=header.weighted_escapes)
            if stored_raw_is_smaller(len(tokens), segment.data, payload):
                stats.raw_segments += 1
                stats.segments += 1
                return SegmentResult(KIND_RAW, 0, segment.data, segment.data)
            if verify:
                back = await self.decode_tokens_from(prompt, payload, len(tokens), header.lane_tokens, header.top_k,
                                                     header.precision_bits, request=request,
                                                     weighted_escapes=header.weighted_escapes)
                if back != tokens:
                    raise IntegrityError(f"verification failed: segment {stats.segments} did not decode back")
            stats.tokens += len(tokens)
            stats.payload_bits += 8 * len(payload)
            stats.ideal_bits += ideal
            stats.segments += 1
            return SegmentResult(KIND_CODED, len(tokens), segment.data, payload)

        return run

    async def decompress(self, chunks: AsyncIterator[bytes],
                         request_id: str) -> AsyncGenerator[tuple[int, bytes], None]:
        """(segment index, original bytes) in order; every segment is CRC-verified before it is yielded."""
        request = object()  # the runner's fairness key: every segment of this request shares it
        reader = ContainerReader(self.limits)
        header: Header | None = None
        prompt: list[int] = []

        async def jobs() -> AsyncIterator[Callable[[], Awaitable[tuple[int, bytes]]]]:
            nonlocal header, prompt
            async for chunk in chunks:
                for item in reader.feed(chunk):
                    if isinstance(item, Header):
                        header = item
                        self._check_header(item)
                        prompt = self.prompt(self.context_tokens(item.context))
                        if item.lane_tokens > self.max_lane_tokens(len(prompt) - 1):
                            raise ContainerError(f"corrupted header: lanes of {item.lane_tokens} tokens do not fit "
                                                 f"the model's {self.max_positions} positions")
                    elif isinstance(item, SegmentRecord):
                        assert header is not None
                        yield self._decode_job(header, item, prompt, request)
            reader.close()

        async for result in ordered(jobs(), self.window):
            yield result

    def _check_header(self, header: Header) -> None:
        """Identity first (409: numerics, then model), then the header's own fields (422/400); all before
        any segment is decoded."""
        if header.numerics != self.numerics:
            raise ModelMismatchError(f"container was made under different numerics ({header.numerics!r}; this "
                                     f"server computes {self.numerics!r})", "numerics_mismatch")
        if header.fingerprint != self.fingerprint:
            raise ModelMismatchError(
                f"container was made with model fingerprint {header.fingerprint.hex()[:16]}…, this server runs "
                f"{self.fingerprint.hex()[:16]}…: decompress it with the same model")
        if header.vocab_size != self.vocab_size:
            raise ModelMismatchError(f"container vocabulary {header.vocab_size} ≠ model vocabulary {self.vocab_size}")
        if header.defect:
            raise ContainerError(header.defect)
        check_params(header, self.separator_id)
        try:
            header.context.decode("utf-8")
        except UnicodeDecodeError:
            raise ContainerError("corrupted header: context is not UTF-8") from None

    def _decode_job(self, header: Header, record: SegmentRecord, prompt: list[int], request: object | None = None
                    ) -> Callable[[], Awaitable[tuple[int, bytes]]]:
        def checked(data: bytes) -> bytes:
            if len(data) != record.original_length or zlib.crc32(data) != record.crc32:
                raise IntegrityError(f"segment {record.index} failed its checksum after decoding: the container is "
                                     "damaged; no output was produced for it")
            return data

        async def read(runner: ExactRunner | None = None) -> bytes:
            try:
                tokens = await self.decode_tokens_from(prompt, record.payload, record.tokens, header.lane_tokens,
                                                       header.top_k, header.precision_bits, request=request,
                                                       weighted_escapes=header.weighted_escapes, runner=runner)
            except PayloadOverrunError as exc:
                raise overrun_error(f"segment {record.index}", exc, record.tokens) from None
            return checked(self.decode_tokens(tokens).encode("utf-8"))

        async def run() -> tuple[int, bytes]:
            if record.kind == KIND_RAW:
                return record.index, checked(record.payload)
            if record.tokens > header.lane_tokens * MAX_LANES:
                raise ContainerError(f"corrupted container: segment {record.index} declares "
                                     f"{record.tokens} tokens, more than {MAX_LANES} lanes")
            if self.tokens_are_nonempty() and record.tokens > record.original_length:
                raise ContainerError(f"corrupted container: segment {record.index} declares {record.tokens} "
                                     f"tokens for {record.original_length} bytes")
            try:
                return record.index, await read()
            except IntegrityError as first:
                second = self._machine_root_reader()
                if second is None:
                    raise
                logger.info("segment failed its checksum; reading it again with this machine's torch square "
                            "root (an earlier release may have written it so)", extra={"segment": record.index})
                try:
                    return record.index, await read(second)
                except IntegrityError:
                    raise first from None

        return run

    async def self_test(self, inject_fault: bool = False) -> None:
        """Round-trip a sample through the exact runner and compare it with the known answer; raises
        when anything differs (the app then keeps the codec off with the reason)."""
        options = CompressOptions(top_k=64, precision_bits=32, lane_tokens=48, lanes=4)
        stats = CompressStats()

        async def source() -> AsyncIterator[bytes]:
            yield SELF_TEST_TEXT.encode()

        container = b"".join([part async for part in self.compress(source(), options, stats, "selftest")])
        if inject_fault:
            damaged = bytearray(container)
            damaged[-40] ^= 0x10
            container = bytes(damaged)

        async def packed() -> AsyncIterator[bytes]:
            yield container

        decoded = b"".join([data async for _, data in self.decompress(packed(), "selftest")])
        if decoded != SELF_TEST_TEXT.encode():
            raise IntegrityError("self-test text did not round-trip")
        await self._check_reference(container)

    async def _check_reference(self, container: bytes) -> None:
        """Known answers, for the default model: the sample's container must equal, byte for byte, the
        one the reference machine wrote in the version this server writes (``exact/reference_v4.cz``,
        or ``reference.cz`` for version 3) — a machine whose arithmetic differed would make containers
        no other machine opens, so its codec stays off — and the other version's reference must decode
        to the sample, so both reading paths are proven at every start."""
        references = {version: path.read_bytes() for version, path in REFERENCE_CONTAINERS.items()}
        header = ContainerReader().feed(references[VERSION])[0]
        assert isinstance(header, Header)
        if header.fingerprint != self.fingerprint or header.numerics != self.numerics:
            return
        if container != references[self.write_version]:
            name = REFERENCE_CONTAINERS[self.write_version].name
            raise IntegrityError("this machine's exact arithmetic gives other integers than the reference machine's "
                                 f"(the self-test container differs from exact/{name})")
        for version, reference in references.items():
            if version == self.write_version:
                continue

            async def packed(data: bytes = reference) -> AsyncIterator[bytes]:
                yield data

            if b"".join([data async for _, data in self.decompress(packed(), "selftest")]) != SELF_TEST_TEXT.encode():
                raise IntegrityError(f"the reference version-{version} container "
                                     f"(exact/{REFERENCE_CONTAINERS[version].name}) did not decode to the sample")


def stored_raw_is_smaller(tokens: int, original: bytes, payload: bytes) -> bool:
    """Whether the segment's coded record would be longer than its raw record: then it is stored raw,
    so no input grows by more than the framing (1,000 NUL bytes coded took 2,304 bytes)."""
    return len(encode_segment(KIND_CODED, tokens, original, payload)) > len(encode_segment(KIND_RAW, 0, original,
                                                                                            original))


def overrun_error(what: str, exc: PayloadOverrunError, tokens: int) -> IntegrityError:
    """The 422 for a payload the decoder ran off the end of (``range_coder.MAX_OVERRUN``)."""
    done = f" after {exc.tokens} of its {tokens} tokens" if exc.tokens is not None else ""
    return IntegrityError(f"{what}'s payload ends before its tokens{done}: damaged or forged ({exc})",
                          code="payload_overrun")


async def peek(chunks: AsyncIterator[bytes], limit: int) -> tuple[bytes, bool, AsyncIterator[bytes]]:
    """The stream's first ``limit`` bytes or more (whole chunks), whether it ended within them, and the
    whole stream again (those bytes first)."""
    head = bytearray()
    source = chunks.__aiter__()
    ended = False
    while len(head) < limit:
        try:
            head += await source.__anext__()
        except StopAsyncIteration:
            ended = True
            break

    async def whole() -> AsyncIterator[bytes]:
        if head:
            yield bytes(head)
        if not ended:
            async for chunk in source:
                yield chunk

    return bytes(head), ended, whole()


async def counted(chunks: AsyncIterator[bytes], stats: CompressStats) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        stats.bytes_in += len(chunk)
        yield chunk
