"""The ``.cz`` container, format versions 3 and 4: a header, one record per segment, a trailer — as streams.

Layout (integers are unsigned LEB128 varints unless marked; the full table is in docs/codec-format.md)::

    header  = "CSCZ" u8:version fingerprint[32] numerics(len, ascii) u8:precision top_k vocab lane_tokens
              params(len, json) context(len, bytes) u32:crc32(header so far)
    coded   = u8:0 tokens orig_len payload_len payload u32:crc32(original) u32:crc32(record so far)
    raw     = u8:1 orig_len original u32:crc32(record so far)
    trailer = "E" segments total_orig_len u32:crc32(every byte before this field)

Each record carries its own CRC, so a streaming reader rejects damage as soon as the damaged record
is complete, and a coded segment's ``crc32(original)`` checks the decoded bytes before any is
returned; the trailer's count and whole-stream CRC catch a stream cut at a record boundary. The two
versions share this layout; they differ in how a payload codes a token outside the top-k (version 4:
under the exact model's own weights, ``exact/frequencies.escape_tables``; version 3: its uniform rank),
so a reader hands the version on with the header.
Varints keep the framing at a few bytes per segment. A reader checks every declared size against
explicit ``Limits`` before waiting for (or buffering) the bytes, so a hostile container fails fast
with ``ContainerError`` — never another exception, a hang, or an allocation sized by the input's claims.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

MAGIC = b"CSCZ"
VERSION = 4
"""What writers write; ``READ_VERSIONS`` what readers read (version 3: every earlier release's containers)."""
READ_VERSIONS = (3, 4)
KIND_CODED = 0
KIND_RAW = 1
PRECISIONS = (16, 24, 32)
FINGERPRINT_BYTES = 32

_U32 = struct.Struct("<I")
_TRAILER_TAG = 0x45
_MAX_VARINT_BYTES = 9
_TOO_LARGE = "container_too_large"
_FIXED_HEAD = len(MAGIC) + 1 + FINGERPRINT_BYTES


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
    max_tokens: int = 1 << 24


@dataclass(frozen=True)
class Header:
    """What decoding needs besides the payloads: model identity, numerics and coding parameters."""

    fingerprint: bytes
    precision_bits: int
    top_k: int
    vocab_size: int
    numerics: str
    lane_tokens: int
    params: dict[str, Any] = field(default_factory=dict)
    context: bytes = b""
    params_canonical: bool = field(default=True, compare=False)
    """Whether the params bytes read were ``canonical_params(params)`` (a writer always writes them so)."""
    defect: str | None = field(default=None, compare=False)
    """Why the coding parameters or params cannot be used, when a header passed its CRC with them: a
    reader reports it (``ContainerError``) after the caller's identity checks, which come first."""
    version: int = VERSION
    """The format version: 4 codes escaped tokens under the model's weights, 3 by their uniform rank."""

    @property
    def weighted_escapes(self) -> bool:
        return self.version >= 4


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


def varint(value: int) -> bytes:
    """Unsigned LEB128: 7 bits a byte, low bits first, high bit set on every byte but the last."""
    if value < 0:
        raise ValueError("varints are unsigned")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_varint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int] | None:
    """``(value, position after it)``, or None when the buffer ends inside the varint."""
    value = 0
    for i in range(_MAX_VARINT_BYTES):
        if pos + i >= len(buf):
            return None
        byte = buf[pos + i]
        value |= (byte & 0x7F) << (7 * i)
        if byte < 0x80:
            if i and byte == 0:
                raise ContainerError("corrupted container: a varint has a redundant zero byte")
            return value, pos + i + 1
    raise ContainerError(f"corrupted container: a varint longer than {_MAX_VARINT_BYTES} bytes")


def _crc_tail(body: bytes) -> bytes:
    return body + _U32.pack(zlib.crc32(body))


def encode_header(header: Header) -> bytes:
    """The header record. Raises ``ValueError`` for a header no reader would accept."""
    numerics = header.numerics.encode("ascii")
    params = canonical_params(header.params)
    if header.version not in READ_VERSIONS:
        raise ValueError(f"version must be one of {READ_VERSIONS}")
    if len(header.fingerprint) != FINGERPRINT_BYTES:
        raise ValueError(f"fingerprint must be {FINGERPRINT_BYTES} bytes")
    if header.precision_bits not in PRECISIONS:
        raise ValueError(f"precision_bits must be one of {PRECISIONS}")
    if not (1 <= header.top_k < header.vocab_size and header.top_k + 1 <= 1 << header.precision_bits
            and header.lane_tokens >= 1):
        raise ValueError("need 1 <= top_k < vocab_size, top_k + 1 <= 2**precision_bits and lane_tokens >= 1")
    return _crc_tail(MAGIC + bytes([header.version]) + header.fingerprint + varint(len(numerics)) + numerics
                     + bytes([header.precision_bits]) + varint(header.top_k) + varint(header.vocab_size)
                     + varint(header.lane_tokens) + varint(len(params)) + params
                     + varint(len(header.context)) + header.context)


def encode_segment(kind: int, tokens: int, original: bytes, payload: bytes) -> bytes:
    """One segment record: ``payload`` is the coded stream (``KIND_CODED``) or ``original`` (``KIND_RAW``)."""
    if kind == KIND_RAW:
        if payload != original or tokens != 0:
            raise ValueError("a raw segment stores its original bytes as payload and has no tokens")
        return _crc_tail(bytes([KIND_RAW]) + varint(len(original)) + original)
    if kind != KIND_CODED or tokens < 1:
        raise ValueError("a coded segment has at least one token")
    return _crc_tail(bytes([KIND_CODED]) + varint(tokens) + varint(len(original)) + varint(len(payload)) + payload
                     + _U32.pack(zlib.crc32(original)))


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
        body = self._out(bytes([_TRAILER_TAG]) + varint(self.segments) + varint(self.total_original))
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
        if self.header is not None and self.header.defect:
            raise ContainerError(self.header.defect)
        self._buf += chunk
        items: list[Header | SegmentRecord | Trailer] = []
        while self.trailer is None:
            item = self._next()
            if item is None:
                break
            items.append(item)
            if isinstance(item, Header) and item.defect:
                break
        if self.trailer is not None and self._buf:
            raise ContainerError("unexpected bytes after the container's end", "trailing_data")
        return items

    def close(self) -> None:
        if self.header is not None and self.header.defect:
            raise ContainerError(self.header.defect)
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
        tag = self._buf[0]
        if tag in (KIND_CODED, KIND_RAW):
            return self._read_segment(tag)
        if tag == _TRAILER_TAG:
            return self._read_trailer()
        raise ContainerError(f"corrupted container: unknown record tag {tag} where segment {self.segments} "
                             "or the trailer should start")

    def _sized(self, pos: int, limit: int, what: str) -> tuple[int, int] | None:
        """A length varint at ``pos`` checked against ``limit`` as soon as it is complete."""
        item = read_varint(self._buf, pos)
        if item is not None and item[0] > limit:
            raise ContainerError(f"{what} of {item[0]} bytes exceeds the limit of {limit}", _TOO_LARGE)
        return item

    def _header_fields(self) -> tuple[list[int], int] | None:
        """The header's varints and its total length, once every size in it is known and checked."""
        buf = self._buf
        if not MAGIC.startswith(bytes(buf[:4])):
            raise ContainerError("not a Cascade container (bad magic)", "bad_magic")
        if len(buf) > 4 and buf[4] not in READ_VERSIONS:
            hint = (" (version 2 containers were made by the float-kernel codec, which only the machine that "
                    "made them could decode; re-compress the original with this server)") if buf[4] == 2 else ""
            raise ContainerError(f"unsupported container version {buf[4]}: this server reads versions "
                                 f"{' and '.join(map(str, READ_VERSIONS))}{hint}", "unsupported_version")
        item = self._sized(_FIXED_HEAD, 255, "header numerics name")
        if item is None:
            return None
        fields = [item[0]]
        pos = item[1] + item[0] + 1
        for _ in range(3):
            item = read_varint(buf, pos)
            if item is None:
                return None
            fields.append(item[0])
            pos = item[1]
        for limit, what in ((self.limits.max_params, "header params"), (self.limits.max_context, "header context")):
            item = self._sized(pos, limit, what)
            if item is None:
                return None
            fields.append(item[0])
            pos = item[1] + item[0]
        return fields, pos + _U32.size

    def _read_header(self) -> Header | None:
        parsed = self._header_fields()
        if parsed is None or len(self._buf) < parsed[1]:
            return None
        (numerics_len, top_k, vocab, lane_tokens, params_len, context_len), length = parsed
        (crc,) = _U32.unpack_from(self._buf, length - _U32.size)
        if zlib.crc32(memoryview(self._buf)[:length - _U32.size]) != crc:
            raise ContainerError("corrupted container: the header fails its checksum")
        raw = self._take(length)
        fingerprint = raw[5:_FIXED_HEAD]
        pos = len(varint(numerics_len)) + _FIXED_HEAD
        numerics = raw[pos:pos + numerics_len]
        precision = raw[pos + numerics_len]
        params = raw[length - _U32.size - context_len - len(varint(context_len)) - params_len:][:params_len]
        context = raw[length - _U32.size - context_len:length - _U32.size]
        defect = None
        if precision not in PRECISIONS or not 1 <= top_k < vocab or top_k + 1 > 1 << precision or lane_tokens < 1:
            defect = (f"corrupted header: invalid coding parameters (precision {precision}, top_k {top_k}, "
                      f"vocabulary {vocab}, lane_tokens {lane_tokens})")
        try:
            values = _params(params)
        except ContainerError as exc:
            values, defect = {}, defect or str(exc)
        self.header = Header(fingerprint, precision, top_k, vocab, _ascii(numerics), lane_tokens, values, context,
                             _is_canonical(values, params), defect, raw[4])
        return self.header

    def _read_segment(self, kind: int) -> SegmentRecord | None:
        index = self.segments
        if index >= self.limits.max_segments:
            raise ContainerError(f"container has more than {self.limits.max_segments} segments", _TOO_LARGE)
        pos = 1
        tokens = 0
        if kind == KIND_CODED:
            item = read_varint(self._buf, pos)
            if item is None:
                return None
            tokens, pos = item
            if not 1 <= tokens <= self.limits.max_tokens:
                raise ContainerError(f"corrupted container: segment {index} declares {tokens} tokens")
        item = self._sized(pos, self.limits.max_original, f"segment {index}'s original")
        if item is None:
            return None
        orig_len, pos = item
        if self.total_original + orig_len > self.limits.max_total_original:
            raise ContainerError(f"segment {index} takes the container's output over the limit of "
                                 f"{self.limits.max_total_original} bytes", _TOO_LARGE)
        payload_len = orig_len
        if kind == KIND_CODED:
            item = self._sized(pos, self.limits.max_payload, f"segment {index}'s payload")
            if item is None:
                return None
            payload_len, pos = item
        end = pos + payload_len + (_U32.size if kind == KIND_CODED else 0)
        if len(self._buf) < end + _U32.size:
            return None
        (crc,) = _U32.unpack_from(self._buf, end)
        if zlib.crc32(memoryview(self._buf)[:end]) != crc:
            raise ContainerError(f"corrupted container: segment {index} fails its checksum")
        record = self._take(end + _U32.size)
        payload = record[pos:pos + payload_len]
        orig_crc = _U32.unpack_from(record, pos + payload_len)[0] if kind == KIND_CODED else zlib.crc32(payload)
        self.segments += 1
        self.total_original += orig_len
        return SegmentRecord(index, kind, tokens, orig_len, orig_crc, payload)

    def _read_trailer(self) -> Trailer | None:
        count_item = read_varint(self._buf, 1)
        if count_item is None:
            return None
        total_item = read_varint(self._buf, count_item[1])
        if total_item is None or len(self._buf) < total_item[1] + _U32.size:
            return None
        self._take(total_item[1])
        expected = self._crc
        (crc,) = _U32.unpack(self._take(_U32.size))
        count, total = count_item[0], total_item[0]
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


def _is_canonical(params: dict[str, Any], raw: bytes) -> bool:
    try:
        return canonical_params(params) == raw
    except ValueError:  # NaN or infinity
        return False


def check_params(header: Header, separator_id: int) -> None:
    """The header's params as docs/codec-format.md defines them: exactly ``{"separator_id": N}`` in its
    canonical spelling, N the model's separator. Raises ``ContainerError`` (``damaged_container``)."""
    if not header.params_canonical:
        raise ContainerError("damaged container: header params are not canonical JSON (sorted keys, no spaces, "
                             "ASCII, no NaN)", "damaged_container")
    value = header.params.get("separator_id")
    if set(header.params) != {"separator_id"} or type(value) is not int or value != separator_id:
        raise ContainerError(f"damaged container: header params {canonical_params(header.params)[:200]!r} are not "
                             f"{{\"separator_id\": {separator_id}}} (this model's separator)", "damaged_container")


def parse_container(data: bytes, limits: Limits | None = None) -> Container:
    """A whole container in one buffer (the streaming reader underneath)."""
    reader = ContainerReader(limits)
    segments = [item for item in reader.feed(data) if isinstance(item, SegmentRecord)]
    reader.close()  # raises a header's defect too
    assert reader.header is not None and reader.trailer is not None
    return Container(reader.header, segments, reader.trailer)
