"""The ``.cz`` container's framing, walked without decoding: split one container into standalone
containers of whole segments, and splice containers of consecutive pieces into one.

Why this works (docs/codec-format.md): a container is a header, independent segment records and a
trailer (segment count, total length, CRC-32 of every byte before it). A segment is coded with
nothing of the segments before it, so the records of containers that share one header (same model,
numerics and coding options) concatenate into a valid container of the concatenated inputs. No new
format: what this module writes is an ordinary container that any release reading the header's
version decodes, byte for byte.

This reads only the framing (record boundaries and CRCs, the same checks a server's reader makes on
them); decoding stays the server's. The server's reader is ``cascade.codec.container``: the client
does not import the service, and tests check the two agree.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from cascade_client.protocol import CascadeError

MAGIC = b"CSCZ"
TRAILER_TAG = 0x45
KIND_CODED, KIND_RAW = 0, 1
_U32 = struct.Struct("<I")
_FIXED_HEAD = len(MAGIC) + 1 + 32  # magic, version, model fingerprint
_MAX_VARINT_BYTES = 9
MAX_RECORD = 1 << 30
"""A record declaring more than this is refused before it is buffered (servers cap far lower)."""


class FramingError(CascadeError):
    """Not a complete, undamaged container (the message says where); found by the client, status 0."""

    def __init__(self, message: str, code: str = "corrupted_container") -> None:
        super().__init__(0, message, code)


@dataclass(frozen=True)
class Record:
    """One record's bytes as they stand in the container; ``original_length`` for segments."""

    kind: str  # "header", "segment" or "trailer"
    raw: bytes
    original_length: int = 0
    segments: int = 0
    """For the trailer: the count it declares."""


def varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _varint_at(buf: bytearray, pos: int) -> tuple[int, int] | None:
    value = 0
    for i in range(_MAX_VARINT_BYTES):
        if pos + i >= len(buf):
            return None
        byte = buf[pos + i]
        value |= (byte & 0x7F) << (7 * i)
        if byte < 0x80:
            return value, pos + i + 1
    raise FramingError("damaged container: a varint is too long")


def _sized_field(buf: bytearray, pos: int) -> int | None:
    """The position after a ``varint length + bytes`` field, or None when it is not all here."""
    item = _varint_at(buf, pos)
    if item is None:
        return None
    length, pos = item
    if length > MAX_RECORD:
        raise FramingError(f"damaged container: a field declares {length} bytes")
    return pos + length if len(buf) >= pos + length else None


def _coding_fields(buf: bytearray) -> tuple[int, int] | None:
    """A header's ``lane_tokens`` and the position after it (numerics, precision_bits, top_k,
    vocab_size, lane_tokens), or None while they are not all here."""
    pos = _sized_field(buf, _FIXED_HEAD)  # numerics
    if pos is None or len(buf) < pos + 1:
        return None
    pos += 1  # precision_bits
    value = 0
    for _ in range(3):  # top_k, vocab_size, lane_tokens
        item = _varint_at(buf, pos)
        if item is None:
            return None
        value, pos = item
    return value, pos


def header_lane_tokens(header: bytes) -> int:
    """The ``lane_tokens`` a container header records (its whole lane plan)."""
    fields = _coding_fields(bytearray(header))
    if fields is None:
        raise FramingError("damaged container: a cut header")
    return fields[0]


class Walker:
    """Incremental: ``feed`` container bytes, get each complete record (CRC-checked) in order.

    After the trailer, ``close`` checks the trailer's count, total and whole-stream CRC; ``close``
    before the trailer (a cut container) raises.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._crc = 0
        self.header: bytes | None = None
        self.segments = 0
        self.total_original = 0
        self.done = False

    def feed(self, chunk: bytes) -> list[Record]:
        if self.done and chunk:
            raise FramingError("unexpected bytes after the container's trailer", "trailing_data")
        self._buf += chunk
        records: list[Record] = []
        while not self.done and (record := self._next()) is not None:
            records.append(record)
        if self.done and self._buf:
            raise FramingError("unexpected bytes after the container's trailer", "trailing_data")
        return records

    def close(self) -> None:
        if not self.done:
            raise FramingError(f"truncated container: it ended after {self.segments} segment(s), before its trailer",
                               "truncated_container")

    def _take(self, end: int, kind: str, original: int = 0, segments: int = 0) -> Record:
        raw = bytes(self._buf[:end])
        del self._buf[:end]
        self._crc = zlib.crc32(raw, self._crc)
        return Record(kind, raw, original, segments)

    def _checked(self, end: int, what: str) -> bool:
        """Whether the record up to ``end`` plus its CRC is here; raises when the CRC is wrong."""
        if len(self._buf) < end + _U32.size:
            return False
        if zlib.crc32(memoryview(self._buf)[:end]) != _U32.unpack_from(self._buf, end)[0]:
            raise FramingError(f"damaged container: {what} fails its checksum")
        return True

    def _next(self) -> Record | None:
        if self.header is None:
            return self._header()
        if not self._buf:
            return None
        tag = self._buf[0]
        if tag == TRAILER_TAG:
            return self._trailer()
        if tag not in (KIND_CODED, KIND_RAW):
            raise FramingError(f"damaged container: unknown record tag {tag} after segment {self.segments}")
        return self._segment(tag)

    def _header(self) -> Record | None:
        if not MAGIC.startswith(bytes(self._buf[:4])):
            raise FramingError("not a Cascade container (bad magic)", "bad_magic")
        fields = _coding_fields(self._buf)
        if fields is None:
            return None
        pos = fields[1]
        for _ in range(2):  # params, context
            end = _sized_field(self._buf, pos)
            if end is None:
                return None
            pos = end
        if not self._checked(pos, "the header"):
            return None
        record = self._take(pos + _U32.size, "header")
        self.header = record.raw
        return record

    def _segment(self, kind: int) -> Record | None:
        pos = 1
        if kind == KIND_CODED:
            item = _varint_at(self._buf, pos)  # tokens
            if item is None:
                return None
            pos = item[1]
        item = _varint_at(self._buf, pos)
        if item is None:
            return None
        original, pos = item
        if kind == KIND_CODED:
            end = _sized_field(self._buf, pos)  # payload
            if end is None:
                return None
            end += _U32.size  # the original bytes' CRC
        else:
            if original > MAX_RECORD:
                raise FramingError(f"damaged container: segment {self.segments} declares {original} bytes")
            end = pos + original
        if not self._checked(end, f"segment {self.segments}"):
            return None
        self.segments += 1
        self.total_original += original
        return self._take(end + _U32.size, "segment", original)

    def _trailer(self) -> Record | None:
        count = _varint_at(self._buf, 1)
        total = count and _varint_at(self._buf, count[1])
        if count is None or total is None or len(self._buf) < total[1] + _U32.size:
            return None
        expected = zlib.crc32(memoryview(self._buf)[:total[1]], self._crc)
        if _U32.unpack_from(self._buf, total[1])[0] != expected:
            raise FramingError("damaged container: the trailer's checksum does not match")
        if (count[0], total[0]) != (self.segments, self.total_original):
            raise FramingError(f"damaged container: the trailer declares {count[0]} segments / {total[0]} bytes, "
                               f"the container holds {self.segments} / {self.total_original}")
        self.done = True
        return self._take(total[1] + _U32.size, "trailer", total[0], count[0])


class Splicer:
    """Writes one container from the containers of consecutive pieces, front to back.

    ``add(container)`` returns the bytes to write for it (the header the first time, then its
    segment records); ``finish()`` the trailer. Every piece must carry the same header: pieces made
    with another model, numerics or options cannot share a container.
    """

    def __init__(self) -> None:
        self._header: bytes | None = None
        self._crc = 0
        self.segments = 0
        self.total_original = 0
        self.bytes_written = 0

    def _out(self, data: bytes) -> bytes:
        self._crc = zlib.crc32(data, self._crc)
        self.bytes_written += len(data)
        return data

    def add(self, container: bytes) -> bytes:
        walker = Walker()
        records = walker.feed(container)
        walker.close()
        out = bytearray()
        for record in records:
            if record.kind == "header":
                if self._header is None:
                    self._header = record.raw
                    out += record.raw
                elif record.raw != self._header:
                    raise FramingError("the pieces' containers have different headers (did another replica serve "
                                       "another model, or other codec settings?)")
            elif record.kind == "segment":
                self.segments += 1
                self.total_original += record.original_length
                out += record.raw
        return self._out(bytes(out))

    def finish(self) -> bytes:
        if self._header is None:
            raise FramingError("no piece was added")
        body = self._out(bytes([TRAILER_TAG]) + varint(self.segments) + varint(self.total_original))
        self.bytes_written += _U32.size
        return body + _U32.pack(self._crc)


def standalone(header: bytes, segments: list[Record]) -> bytes:
    """A container of ``segments`` (whole records of a container with ``header``) on their own."""
    body = header + b"".join(r.raw for r in segments) + bytes([TRAILER_TAG]) + varint(len(segments)) \
        + varint(sum(r.original_length for r in segments))
    return body + _U32.pack(zlib.crc32(body))


def cut(buffer: bytes | bytearray, piece_bytes: int) -> int:
    """Where the next piece of an input ends (``0 < cut <= piece_bytes < len(buffer)``): after the last
    newline in the piece's second half, else at a UTF-8 character boundary, else at ``piece_bytes``.

    The cut depends only on the bytes, so the same input and piece size always give the same pieces
    (and so the same container), whichever replicas compress them.
    """
    newline = buffer.rfind(b"\n", piece_bytes // 2, piece_bytes)
    if newline >= 0:
        return newline + 1
    end = piece_bytes
    while end > piece_bytes - 4 and end > 0 and buffer[end] & 0xC0 == 0x80:  # inside a UTF-8 character
        end -= 1
    return end if end > 0 else piece_bytes
