"""The ``.cz`` container: a header, one record per segment, a trailer — written and read as streams.

Layout (little endian; the full table is in docs/codec-format.md)::

    header  = "CSCZ" u8:version fingerprint[32] u8:precision u16:top_k u32:vocab
              u8:len dtype  u16:len params-json  u32:len context  u32:crc32(header so far)
    segment = "S" u8:kind u32:tokens u32:orig_len u32:crc32(original) u32:payload_len payload
              u32:crc32(record so far)
    trailer = "E" u32:segments u64:total_orig_len u32:crc32(every byte before this field)

Each record carries its own CRC, so a streaming reader rejects damage as soon as the damaged record
is complete; the trailer's count and whole-stream CRC catch a stream cut at a record boundary.
A reader checks every declared size against explicit ``Limits`` before waiting for (or buffering)
the bytes, so a hostile container fails fast with ``ContainerError`` — never another exception,
a hang, or an allocation sized by the input's claims.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

MAGIC = b"CSCZ"
VERSION = 2
KIND_CODED = 0
KIND_RAW = 1
PRECISIONS = (16, 24, 32)
FINGERPRINT_BYTES = 32

_HEAD = struct.Struct("<4sB32sBHI")
_DTYPE_LEN = struct.Struct("<B")
_PARAMS_LEN = struct.Struct("<H")
_U32 = struct.Struct("<I")
_SEGMENT = struct.Struct("<cBIIII")
_TRAILER = struct.Struct("<cIQ")
_SEGMENT_TAG = b"S"
_TRAILER_TAG = b"E"
_TOO_LARGE = "container_too_large"


class ContainerError(ValueError):
    """A container that cannot be read: truncated, corrupted, over a limit, or not a Cascade container.

    ``code`` is a stable machine-readable reason (``bad_magic``, ``unsupported_version``,
    ``truncated_container``, ``corrupted_container``, ``container_too_large``, ``trailing_data``).
    """

    def __init__(self, message: str, code: str = "corrupted_container") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Limits:
    """Upper bounds a reader enforces on declared sizes (defaults suit a server)."""

    max_segments: int = 1 << 20
    max_payload: int = 64 << 20
    max_original: int = 64 << 20
    max_total_original: int = 1 << 34
    max_context: int = 1 << 20
    max_params: int = 1 << 16


@dataclass(frozen=True)
class Header:
    """What decoding needs besides the payloads: model identity and coding parameters."""

    fingerprint: bytes
    precision_bits: int
    top_k: int
    vocab_size: int
    dtype: str
    params: dict[str, Any] = field(default_factory=dict)
    context: bytes = b""


@dataclass(frozen=True)
class SegmentRecord:
    index: int
    kind: int
    tokens: int
    original_length: int
    crc32: int
    payload: bytes


@dataclass(frozen=True)
class Trailer:
    segments: int
    total_original_length: int


@dataclass(frozen=True)
class Container:
    header: Header
    segments: list[SegmentRecord]
    trailer: Trailer


def canonical_params(params: dict[str, Any]) -> bytes:
    """The one JSON spelling of ``params`` (sorted keys, no spaces, ASCII, no NaN)."""
    return json.dumps(params, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("ascii")


def _crc_tail(body: bytes) -> bytes:
    return body + _U32.pack(zlib.crc32(body))


def encode_header(header: Header) -> bytes:
    """The header record. Raises ``ValueError`` for a header no reader would accept."""
    dtype = header.dtype.encode("ascii")
    params = canonical_params(header.params)
    if len(header.fingerprint) != FINGERPRINT_BYTES:
        raise ValueError(f"fingerprint must be {FINGERPRINT_BYTES} bytes")
    if header.precision_bits not in PRECISIONS:
        raise ValueError(f"precision_bits must be one of {PRECISIONS}")
    if not (1 <= header.top_k <= 0xFFFF and 2 <= header.vocab_size <= 0xFFFFFFFF):
        raise ValueError("top_k must lie in [1, 65535] and vocab_size in [2, 2**32)")
    if len(dtype) > 0xFF or len(params) > 0xFFFF or len(header.context) > 0xFFFFFFFF:
        raise ValueError("dtype, params or context too long for the header")
    return _crc_tail(_HEAD.pack(MAGIC, VERSION, header.fingerprint, header.precision_bits, header.top_k,
                                header.vocab_size)
                     + _DTYPE_LEN.pack(len(dtype)) + dtype + _PARAMS_LEN.pack(len(params)) + params
                     + _U32.pack(len(header.context)) + header.context)


def encode_segment(kind: int, tokens: int, original: bytes, payload: bytes) -> bytes:
    """One segment record: ``payload`` is the coded stream (``KIND_CODED``) or ``original`` (``KIND_RAW``)."""
    if kind not in (KIND_CODED, KIND_RAW) or (kind == KIND_RAW and (payload != original or tokens != 0)):
        raise ValueError("a raw segment stores its original bytes as payload and has no tokens")
    if not (0 <= tokens <= 0xFFFFFFFF and len(original) <= 0xFFFFFFFF and len(payload) <= 0xFFFFFFFF):
        raise ValueError("segment too large for the format")
    head = _SEGMENT.pack(_SEGMENT_TAG, kind, tokens, len(original), zlib.crc32(original), len(payload))
    return _crc_tail(head + payload)


class ContainerWriter:
    """Produces the container piece by piece, keeping the running CRC, segment count and size."""

    def __init__(self, header: Header) -> None:
        self.header = header
        self.segments = 0
        self.total_original = 0
        self.bytes_written = 0
        self._crc = 0

    def _out(self, data: bytes) -> bytes:
        self._crc = zlib.crc32(data, self._crc)
        self.bytes_written += len(data)
        return data

    def header_bytes(self) -> bytes:
        return self._out(encode_header(self.header))

    def segment_bytes(self, kind: int, tokens: int, original: bytes, payload: bytes) -> bytes:
        record = encode_segment(kind, tokens, original, payload)
        self.segments += 1
        self.total_original += len(original)
        return self._out(record)

    def trailer_bytes(self) -> bytes:
        body = self._out(_TRAILER.pack(_TRAILER_TAG, self.segments, self.total_original))
        crc = _U32.pack(self._crc)
        self.bytes_written += len(crc)
        return body + crc


class ContainerReader:
    """Incremental parser: ``feed`` chunks, get each ``Header``/``SegmentRecord``/``Trailer`` once complete.

    After a ``ContainerError`` the reader is spent. ``close`` says the input ended: it raises unless
    the trailer was read.
    """

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self.header: Header | None = None
        self.trailer: Trailer | None = None
        self.segments = 0
        self.total_original = 0
        self._buf = bytearray()
        self._crc = 0

    def feed(self, chunk: bytes) -> list[Header | SegmentRecord | Trailer]:
        """Append ``chunk``; return the records it completed, in order."""
        if self.trailer is not None and chunk:
            raise ContainerError("unexpected bytes after the container's end", "trailing_data")
        self._buf += chunk
        items: list[Header | SegmentRecord | Trailer] = []
        while self.trailer is None:
            item = self._next()
            if item is None:
                break
            items.append(item)
        if self.trailer is not None and self._buf:
            raise ContainerError("unexpected bytes after the container's end", "trailing_data")
        return items

    def close(self) -> None:
        if self.header is None:
            raise ContainerError("empty or truncated container: no complete header", "truncated_container")
        if self.trailer is None:
            raise ContainerError(f"truncated container: input ended after {self.segments} complete "
                                 "segment(s), before the trailer", "truncated_container")

    def _take(self, n: int) -> bytes:
        data = bytes(self._buf[:n])
        del self._buf[:n]
        self._crc = zlib.crc32(data, self._crc)
        return data

    def _next(self) -> Header | SegmentRecord | Trailer | None:
        if self.header is None:
            return self._read_header()
        if not self._buf:
            return None
        tag = bytes(self._buf[:1])
        if tag == _SEGMENT_TAG:
            return self._read_segment()
        if tag == _TRAILER_TAG:
            return self._read_trailer()
        raise ContainerError(f"corrupted container: unknown record tag {tag!r} where segment {self.segments} "
                             "or the trailer should start")

    def _header_length(self) -> int | None:
        """The whole header's length once its variable-length fields' sizes are known and checked."""
        buf = self._buf
        if not MAGIC.startswith(bytes(buf[:4])):
            raise ContainerError("not a Cascade container (bad magic)", "bad_magic")
        if len(buf) > 4 and buf[4] != VERSION:
            raise ContainerError(f"unsupported container version {buf[4]} (this reader reads version "
                                 f"{VERSION})", "unsupported_version")
        pos = _HEAD.size
        if len(buf) < pos + _DTYPE_LEN.size:
            return None
        pos += _DTYPE_LEN.size + buf[pos]
        if len(buf) < pos + _PARAMS_LEN.size:
            return None
        params_len: int = _PARAMS_LEN.unpack_from(buf, pos)[0]
        if params_len > self.limits.max_params:
            raise ContainerError(f"header params of {params_len} bytes exceed the limit", _TOO_LARGE)
        pos += _PARAMS_LEN.size + params_len
        if len(buf) < pos + _U32.size:
            return None
        context_len: int = _U32.unpack_from(buf, pos)[0]
        if context_len > self.limits.max_context:
            raise ContainerError(f"header context of {context_len} bytes exceeds the limit", _TOO_LARGE)
        return pos + _U32.size + context_len + _U32.size

    def _read_header(self) -> Header | None:
        length = self._header_length()
        if length is None or len(self._buf) < length:
            return None
        (crc,) = _U32.unpack_from(self._buf, length - _U32.size)
        if zlib.crc32(memoryview(self._buf)[:length - _U32.size]) != crc:
            raise ContainerError("corrupted container: the header fails its checksum")
        raw = self._take(length)
        _, _, fingerprint, precision, top_k, vocab = _HEAD.unpack_from(raw)
        pos = _HEAD.size
        dtype = raw[pos + 1:pos + 1 + raw[pos]]
        pos += 1 + raw[pos]
        (params_len,) = _PARAMS_LEN.unpack_from(raw, pos)
        params = raw[pos + 2:pos + 2 + params_len]
        context = raw[pos + 2 + params_len + 4:length - 4]
        if precision not in PRECISIONS or top_k < 1 or vocab < 2:
            raise ContainerError(f"corrupted header: invalid coding parameters (precision {precision}, "
                                 f"top_k {top_k}, vocabulary {vocab})")
        self.header = Header(fingerprint, precision, top_k, vocab, _ascii(dtype), _params(params), context)
        return self.header

    def _read_segment(self) -> SegmentRecord | None:
        if len(self._buf) < _SEGMENT.size:
            return None
        _, kind, tokens, orig_len, orig_crc, payload_len = _SEGMENT.unpack_from(self._buf)
        index = self.segments
        if kind not in (KIND_CODED, KIND_RAW):
            raise ContainerError(f"corrupted container: segment {index} has unknown kind {kind}")
        if kind == KIND_RAW and (payload_len != orig_len or tokens != 0):
            raise ContainerError(f"corrupted container: raw segment {index} has inconsistent lengths")
        if index >= self.limits.max_segments:
            raise ContainerError(f"container has more than {self.limits.max_segments} segments", _TOO_LARGE)
        if payload_len > self.limits.max_payload or orig_len > self.limits.max_original:
            raise ContainerError(f"segment {index} declares {payload_len} payload bytes and {orig_len} "
                                 "original bytes, over the limit", _TOO_LARGE)
        if self.total_original + orig_len > self.limits.max_total_original:
            raise ContainerError(f"segment {index} takes the container's output over the limit of "
                                 f"{self.limits.max_total_original} bytes", _TOO_LARGE)
        end = _SEGMENT.size + payload_len
        if len(self._buf) < end + _U32.size:
            return None
        (crc,) = _U32.unpack_from(self._buf, end)
        if zlib.crc32(memoryview(self._buf)[:end]) != crc:
            raise ContainerError(f"corrupted container: segment {index} fails its checksum")
        payload = self._take(end + _U32.size)[_SEGMENT.size:end]
        if kind == KIND_RAW and zlib.crc32(payload) != orig_crc:
            raise ContainerError(f"corrupted container: raw segment {index} does not match its original "
                                 "checksum")
        self.segments += 1
        self.total_original += orig_len
        return SegmentRecord(index, kind, tokens, orig_len, orig_crc, payload)

    def _read_trailer(self) -> Trailer | None:
        if len(self._buf) < _TRAILER.size + _U32.size:
            return None
        body = self._take(_TRAILER.size)
        expected = self._crc
        (crc,) = _U32.unpack(self._take(_U32.size))
        _, count, total = _TRAILER.unpack(body)
        if crc != expected:
            raise ContainerError(f"corrupted container: the trailer's checksum does not match (after "
                                 f"{self.segments} segments)")
        if count != self.segments or total != self.total_original:
            raise ContainerError(f"corrupted container: the trailer declares {count} segments / {total} "
                                 f"bytes, the stream held {self.segments} / {self.total_original}")
        self.trailer = Trailer(count, total)
        return self.trailer


def _ascii(raw: bytes) -> str:
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        raise ContainerError("corrupted header: dtype is not ASCII") from None


def _params(raw: bytes) -> dict[str, Any]:
    try:
        params = json.loads(raw) if raw else {}
    except (ValueError, RecursionError):
        raise ContainerError("corrupted header: params are not valid JSON") from None
    if not isinstance(params, dict):
        raise ContainerError("corrupted header: params are not a JSON object")
    return params


def parse_container(data: bytes, limits: Limits | None = None) -> Container:
    """A whole container in one buffer (the streaming reader underneath)."""
    reader = ContainerReader(limits)
    segments = [item for item in reader.feed(data) if isinstance(item, SegmentRecord)]
    reader.close()
    assert reader.header is not None and reader.trailer is not None
    return Container(reader.header, segments, reader.trailer)
