"""The ``.cz`` container: a header, one record per segment, a trailer — written and read as a stream.

Layout (little endian; full table in docs/codec-format.md)::

    header  = "CSCZ" u8:version fingerprint[32] u8:precision u16:top_k u32:vocab
              u8:len dtype  u16:len params-json  u32:len context  u32:crc32(header so far)
    segment = "S" u8:kind u32:tokens u32:orig_len u32:crc32(original) u32:payload_len payload
              u32:crc32(record so far)
    trailer = "E" u32:segments u64:total_orig_len u32:crc32(every byte before this field)

Every length is checked against explicit limits *and* against what the record can hold before any
allocation, so hostile containers fail fast with ``ContainerError`` — never a crash or a hang.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

MAGIC = b"CSCZ"
VERSION = 1
KIND_CODED = 0
KIND_RAW = 1
_HEAD = struct.Struct("<4sB32sBHI")
_SEG = struct.Struct("<cBIIII")
_TRAILER = struct.Struct("<cIQ")
_U32 = struct.Struct("<I")


class ContainerError(ValueError):
    """A container that cannot be decoded: truncated, corrupted, or not a Cascade container."""

    def __init__(self, message: str, code: str = "invalid_container") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Limits:
    max_segments: int = 1 << 20
    max_payload: int = 64 << 20
    max_original: int = 64 << 20
    max_total_original: int = 1 << 34
    max_context: int = 1 << 20
    max_params: int = 1 << 16


@dataclass(frozen=True)
class Header:
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


def _params_json(params: dict[str, Any]) -> bytes:
    return json.dumps(params, sort_keys=True, separators=(",", ":")).encode()


class ContainerWriter:
    """Produces the container piece by piece, keeping the running CRC and segment count."""

    def __init__(self, header: Header) -> None:
        self.header = header
        self._crc = 0
        self.segments = 0
        self.total_original = 0
        self.bytes_written = 0

    def _out(self, data: bytes) -> bytes:
        self._crc = zlib.crc32(data, self._crc)
        self.bytes_written += len(data)
        return data

    def header_bytes(self) -> bytes:
        h = self.header
        dtype = h.dtype.encode()
        params = _params_json(h.params)
        body = (_HEAD.pack(MAGIC, VERSION, h.fingerprint, h.precision_bits, h.top_k, h.vocab_size)
                + bytes([len(dtype)]) + dtype + struct.pack("<H", len(params)) + params
                + _U32.pack(len(h.context)) + h.context)
        return self._out(body + _U32.pack(zlib.crc32(body)))

    def segment_bytes(self, kind: int, tokens: int, original: bytes, payload: bytes) -> bytes:
        body = _SEG.pack(b"S", kind, tokens, len(original), zlib.crc32(original), len(payload)) + payload
        self.segments += 1
        self.total_original += len(original)
        return self._out(body + _U32.pack(zlib.crc32(body)))

    def trailer_bytes(self) -> bytes:
        body = self._out(_TRAILER.pack(b"E", self.segments, self.total_original))
        crc = _U32.pack(self._crc)
        self.bytes_written += len(crc)
        return body + crc


class ContainerReader:
    """Incremental parser: ``feed`` chunks, get ``Header``/``SegmentRecord``/``Trailer`` as they complete."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self._buf = bytearray()
        self._crc = 0
        self.header: Header | None = None
        self.trailer: Trailer | None = None
        self.segments = 0
        self.total_original = 0

    def _consume(self, n: int) -> bytes:
        data = bytes(self._buf[:n])
        del self._buf[:n]
        self._crc = zlib.crc32(data, self._crc)
        return data

    def feed(self, chunk: bytes) -> Iterator[Header | SegmentRecord | Trailer]:
        if self.trailer is not None and chunk:
            raise ContainerError("unexpected bytes after the container's end")
        self._buf += chunk
        while True:
            item = self._next()
            if item is None:
                return
            yield item

    def close(self) -> None:
        """The input ended: it must have ended exactly at the trailer."""
        if self.header is None:
            raise ContainerError("empty or truncated container (no complete header)", "truncated_container")
        if self.trailer is None:
            raise ContainerError(f"truncated container: input ended after {self.segments} segment(s), "
                                 "before the trailer", "truncated_container")

    def _next(self) -> Header | SegmentRecord | Trailer | None:
        if self.trailer is not None:
            if self._buf:
                raise ContainerError("unexpected bytes after the container's end")
            return None
        if self.header is None:
            return self._read_header()
        if not self._buf:
            return None
        tag = self._buf[:1]
        if tag == b"S":
            return self._read_segment()
        if tag == b"E":
            return self._read_trailer()
        raise ContainerError(f"corrupted container: unknown record tag {bytes(tag)!r} after segment {self.segments}")

    def _read_header(self) -> Header | None:
        buf = self._buf
        if len(buf) >= 4 and bytes(buf[:4]) != MAGIC:
            raise ContainerError("not a Cascade container (bad magic)", "bad_magic")
        if len(buf) >= 5 and buf[4] != VERSION:
            raise ContainerError(f"unsupported container version {buf[4]} (this server reads {VERSION})",
                                 "unsupported_version")
        pos = _HEAD.size
        if len(buf) < pos + 1:
            return None
        dtype_len = buf[pos]
        pos += 1 + dtype_len
        if len(buf) < pos + 2:
            return None
        (params_len,) = struct.unpack_from("<H", buf, pos)
        if params_len > self.limits.max_params:
            raise ContainerError("corrupted header: params too large")
        pos += 2 + params_len
        if len(buf) < pos + 4:
            return None
        (context_len,) = _U32.unpack_from(buf, pos)
        if context_len > self.limits.max_context:
            raise ContainerError(f"corrupted header: context of {context_len} bytes exceeds the limit")
        pos += 4 + context_len
        if len(buf) < pos + 4:
            return None
        (crc,) = _U32.unpack_from(buf, pos)
        if zlib.crc32(bytes(buf[:pos])) != crc:
            raise ContainerError("corrupted header (checksum mismatch)", "corrupted_container")
        raw = self._consume(pos + 4)
        _, _, fingerprint, precision, top_k, vocab = _HEAD.unpack_from(raw)
        start = _HEAD.size + 1
        dtype = raw[start:start + dtype_len].decode("ascii", "replace")
        start += dtype_len + 2
        try:
            params = json.loads(raw[start:start + params_len]) if params_len else {}
        except ValueError:
            raise ContainerError("corrupted header: params are not JSON") from None
        start += params_len + 4
        context = raw[start:start + context_len]
        if precision not in (16, 24, 32) or top_k < 1 or vocab < 2 or not isinstance(params, dict):
            raise ContainerError("corrupted header: invalid coding parameters")
        self.header = Header(fingerprint, precision, top_k, vocab, dtype, params, context)
        return self.header

    def _read_segment(self) -> SegmentRecord | None:
        buf = self._buf
        if len(buf) < _SEG.size:
            return None
        _, kind, tokens, orig_len, orig_crc, payload_len = _SEG.unpack_from(buf)
        index = self.segments
        if kind not in (KIND_CODED, KIND_RAW):
            raise ContainerError(f"corrupted container: segment {index} has unknown kind {kind}")
        if payload_len > self.limits.max_payload or orig_len > self.limits.max_original:
            raise ContainerError(f"corrupted container: segment {index} declares {payload_len} payload bytes / "
                                 f"{orig_len} original bytes, over the limit")
        if kind == KIND_RAW and payload_len != orig_len:
            raise ContainerError(f"corrupted container: raw segment {index} length mismatch")
        if self.segments >= self.limits.max_segments:
            raise ContainerError(f"container has more than {self.limits.max_segments} segments")
        end = _SEG.size + payload_len
        if len(buf) < end + 4:
            return None
        (crc,) = _U32.unpack_from(buf, end)
        if zlib.crc32(bytes(buf[:end])) != crc:
            raise ContainerError(f"corrupted container: segment {index} fails its checksum", "corrupted_container")
        raw = self._consume(end + 4)
        self.segments += 1
        self.total_original += orig_len
        if self.total_original > self.limits.max_total_original:
            raise ContainerError("container declares more output than the limit")
        return SegmentRecord(index, kind, tokens, orig_len, orig_crc, raw[_SEG.size:end])

    def _read_trailer(self) -> Trailer | None:
        if len(self._buf) < _TRAILER.size + 4:
            return None
        body = self._consume(_TRAILER.size)
        expected = self._crc
        (crc,) = _U32.unpack(bytes(self._buf[:4]))
        del self._buf[:4]
        _, count, total = _TRAILER.unpack(body)
        if crc != expected:
            raise ContainerError("corrupted container: trailer checksum mismatch", "corrupted_container")
        if count != self.segments or total != self.total_original:
            raise ContainerError(f"corrupted container: trailer says {count} segments, found {self.segments}")
        self.trailer = Trailer(count, total)
        return self.trailer


def parse_container(data: bytes, limits: Limits | None = None) -> tuple[Header, list[SegmentRecord]]:
    """Whole-buffer convenience over ``ContainerReader``."""
    reader = ContainerReader(limits)
    segments = [item for item in reader.feed(data) if isinstance(item, SegmentRecord)]
    reader.close()
    assert reader.header is not None
    return reader.header, segments
