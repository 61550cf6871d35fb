"""The client's container framing (``cascade_client.framing``) against the service's own reader and
writer (``cascade.codec.container``): splitting and splicing give ordinary containers, byte for byte
what one writer makes of the same segments, and damage is always caught; the spread driver
(``cascade_client.spread``) gives one container whatever its concurrency."""

from __future__ import annotations

import asyncio
import dataclasses
import io
from collections.abc import AsyncIterator

import pytest
from cascade.codec.container import KIND_CODED, KIND_RAW, ContainerWriter, Header, parse_container
from cascade_client.framing import FramingError, Splicer, Walker, cut, standalone
from cascade_client.protocol import CompressStats
from cascade_client.spread import compress_spread, decompress_spread
from hypothesis import given, settings
from hypothesis import strategies as st

HEADER = Header(fingerprint=bytes(range(32)), precision_bits=24, top_k=64, vocab_size=8192, numerics="exact-llama-1",
                lane_tokens=1000, params={"separator_id": 0}, context=b"ctx")

segment = st.one_of(
    st.tuples(st.just(KIND_CODED), st.integers(1, 3000), st.binary(max_size=60), st.binary(min_size=1, max_size=200)),
    st.tuples(st.just(KIND_RAW), st.just(0), st.binary(max_size=300), st.just(b"")),
)


def _container(segments: list[tuple[int, int, bytes, bytes]], header: Header = HEADER) -> bytes:
    writer = ContainerWriter(header)
    out = writer.header_bytes()
    for kind, tokens, original, payload in segments:
        out += writer.segment_bytes(kind, tokens, original, original if kind == KIND_RAW else payload)
    return out + writer.trailer_bytes()


def _walk(data: bytes, step: int) -> list[bytes]:
    walker = Walker()
    raws = [r.raw for i in range(0, len(data), step) for r in walker.feed(data[i:i + step])]
    walker.close()
    return raws


@settings(max_examples=150, deadline=None)
@given(st.lists(segment, max_size=8), st.integers(1, 97))
def test_walker_splits_records_where_the_service_reader_does(segments: list, step: int) -> None:
    data = _container(segments)
    raws = _walk(data, step)
    assert b"".join(raws) == data and len(raws) == len(segments) + 2
    assert len(parse_container(data).segments) == len(segments)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(segment, max_size=4), min_size=1, max_size=5))
def test_spliced_pieces_are_the_container_one_writer_makes_of_all_segments(pieces: list[list]) -> None:
    splicer = Splicer()
    out = b"".join(splicer.add(_container(piece)) for piece in pieces) + splicer.finish()
    assert out == _container([s for piece in pieces for s in piece])
    assert splicer.bytes_written == len(out)


@settings(max_examples=100, deadline=None)
@given(st.lists(segment, min_size=1, max_size=8), st.data())
def test_standalone_groups_of_segments_parse_and_keep_their_records(segments: list, data: st.DataObject) -> None:
    walker = Walker()
    records = [r for r in walker.feed(_container(segments)) if r.kind == "segment"]
    assert walker.header is not None
    start = data.draw(st.integers(0, len(records) - 1))
    stop = data.draw(st.integers(start + 1, len(records)))
    group = standalone(walker.header, records[start:stop])
    assert group == _container(segments[start:stop])
    assert parse_container(group).trailer.segments == stop - start


@settings(max_examples=200, deadline=None)
@given(st.lists(segment, max_size=4), st.data())
def test_any_damaged_byte_is_caught(segments: list, data: st.DataObject) -> None:
    container = bytearray(_container(segments))
    at = data.draw(st.integers(0, len(container) - 1))
    container[at] ^= data.draw(st.integers(1, 255))
    with pytest.raises(FramingError):
        _walk(bytes(container), 64)


def test_cut_and_trailing_bytes_are_errors_with_the_servers_codes() -> None:
    data = _container([(KIND_RAW, 0, b"abc", b"")])
    with pytest.raises(FramingError, match="truncated") as cut_short:
        _walk(data[:-1], 7)
    with pytest.raises(FramingError, match="after the container's trailer") as trailing:
        _walk(data + b"x", 1000)
    with pytest.raises(FramingError) as flipped:
        _walk(data[:-1] + bytes([data[-1] ^ 1]), 1000)
    codes = [e.value.code for e in (cut_short, trailing, flipped)]
    assert codes == ["truncated_container", "trailing_data", "corrupted_container"]


def test_pieces_with_another_header_cannot_be_spliced() -> None:
    other = Header(**{**HEADER.__dict__, "top_k": 32})
    splicer = Splicer()
    splicer.add(_container([(KIND_RAW, 0, b"a", b"")]))
    with pytest.raises(FramingError, match="different headers"):
        splicer.add(_container([(KIND_RAW, 0, b"b", b"")], other))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400).map(lambda t: t.encode()), st.integers(8, 64))
def test_pieces_cover_the_input_end_at_line_or_character_boundaries(text: bytes, piece_bytes: int) -> None:
    rest, parts = text, []
    while len(rest) > piece_bytes:
        end = cut(rest, piece_bytes)
        assert 0 < end <= piece_bytes
        parts.append(rest[:end])
        rest = rest[end:]
    parts.append(rest)
    assert b"".join(parts) == text
    for part in parts:
        part.decode()  # a character is never split (none is longer than 4 bytes < piece_bytes / 2)


class RawCoder:
    """Stands in for a replica in the spread driver's own test: its containers store each piece as
    raw segments of at most 50 bytes (the real codec's are checked over two replicas in
    tests/integration/test_replicas.py); it decodes by the service's own reader."""

    def __init__(self) -> None:
        self.calls = 0

    async def compress_to(self, sink: io.BytesIO, source: bytes, **options: object) -> CompressStats:
        self.calls += 1
        sink.write(_container([(KIND_RAW, 0, source[i:i + 50], b"") for i in range(0, len(source), 50)]))
        return CompressStats(len(source), 0, 0, 0.0, 0.0)

    async def decompress(self, container: bytes) -> bytes:
        self.calls += 1
        return b"".join(s.payload for s in parse_container(container).segments)


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=3000).map(lambda t: t.encode()), st.integers(64, 700), st.integers(1, 4), st.integers(1, 4))
def test_spread_gives_one_container_whatever_the_concurrency_and_restores_the_input(
        text: bytes, piece_bytes: int, first: int, second: int) -> None:
    async def spread(concurrency: int) -> bytes:
        out = io.BytesIO()

        async def write(data: bytes) -> None:
            out.write(data)

        stats = await compress_spread(RawCoder(), _chunks(text), write, piece_bytes=piece_bytes,
                                      concurrency=concurrency)
        assert stats.bytes_in == len(text) and stats.bytes_out == len(out.getvalue())
        return out.getvalue()

    async def restore(container: bytes, concurrency: int) -> bytes:
        out = io.BytesIO()

        async def write(data: bytes) -> None:
            out.write(data)

        stats = await decompress_spread(RawCoder(), _chunks(container), write, piece_bytes=piece_bytes,
                                        concurrency=concurrency)
        assert stats.bytes == len(text)
        return out.getvalue()

    container = asyncio.run(spread(first))
    assert asyncio.run(spread(second)) == container
    assert b"".join(s.payload for s in parse_container(container).segments) == text
    assert asyncio.run(restore(container, second)) == text


async def _chunks(data: bytes, size: int = 333) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i:i + size]


class PlanningCoder(RawCoder):
    """Like a server: without ``lane_tokens`` a piece gets a lane plan of its own size in its header."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[object] = []

    async def compress_to(self, sink: io.BytesIO, source: bytes, **options: object) -> CompressStats:
        self.calls += 1
        self.asked.append(options.get("lane_tokens"))
        lane_tokens = options.get("lane_tokens") or 100 + len(source) % 97
        header = dataclasses.replace(HEADER, lane_tokens=int(lane_tokens))  # type: ignore[call-overload]
        for half in (0, 1):  # the header arrives before the rest, as a stream's does
            await asyncio.sleep(0)
            data = _container([(KIND_RAW, 0, source[i:i + 50], b"") for i in range(0, len(source), 50)], header)
            sink.write(data[:len(data) // 2] if half == 0 else data[len(data) // 2:])
        return CompressStats(len(source), 0, 0, 0.0, 0.0)


@pytest.mark.parametrize("concurrency", [1, 3])
def test_spread_pieces_share_the_first_pieces_lane_plan(concurrency: int) -> None:
    text = b"".join(b"line %d of a file that is cut into pieces\n" % i for i in range(200))
    coder, out = PlanningCoder(), io.BytesIO()

    async def write(data: bytes) -> None:
        out.write(data)

    asyncio.run(compress_spread(coder, _chunks(text), write, piece_bytes=700, concurrency=concurrency))
    first_plan = parse_container(out.getvalue()).header.lane_tokens
    assert coder.asked[0] is None and coder.asked[1:] == [first_plan] * (coder.calls - 1) and coder.calls > 3
    assert b"".join(s.payload for s in parse_container(out.getvalue()).segments) == text
