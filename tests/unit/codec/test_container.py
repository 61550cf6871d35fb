"""Container: streaming round trips; truncation, bit flips, hostile sizes, stray bytes → ContainerError."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import struct
import zlib

import pytest
from cascade.codec.container import (
    KIND_CODED,
    KIND_RAW,
    VERSION,
    Container,
    ContainerError,
    ContainerReader,
    ContainerWriter,
    Header,
    Limits,
    SegmentRecord,
    Trailer,
    check_params,
    encode_header,
    parse_container,
    varint,
)
from hypothesis import given, settings
from hypothesis import strategies as st

HEADER = Header(b"\x07" * 32, 32, 64, 8192, "exact-llama-1", 1000, {"separator_id": 1, "temperature": 1.0},
                "ctx ✓".encode())
SEGMENTS = [(KIND_CODED, 3, b"abc", b"\x01\x02\x03"), (KIND_RAW, 0, b"\xff\xfe", b"\xff\xfe"),
            (KIND_CODED, 1, "é".encode(), b"\x09")]


def _container(header: Header, segments: list[tuple[int, int, bytes, bytes]]) -> bytes:
    writer = ContainerWriter(header)
    data = writer.header_bytes()
    for kind, tokens, original, payload in segments:
        data += writer.segment_bytes(kind, tokens, original, payload)
    data += writer.trailer_bytes()
    assert writer.bytes_written == len(data)
    return data


SAMPLE = _container(HEADER, SEGMENTS)
HEADER_LEN = len(encode_header(HEADER))


def _with_header_crc(data: bytes, header_len: int) -> bytes:
    body = data[:header_len - 4]
    return body + struct.pack("<I", zlib.crc32(body)) + data[header_len:]


def test_container_round_trips_header_segments_and_trailer() -> None:
    parsed = parse_container(SAMPLE)
    assert parsed.header == HEADER
    assert parsed.trailer == Trailer(3, 7)
    assert [(s.index, s.kind, s.tokens, s.original_length, s.crc32, s.payload) for s in parsed.segments] == [
        (i, kind, tokens, len(original), zlib.crc32(original), payload)
        for i, (kind, tokens, original, payload) in enumerate(SEGMENTS)]


JSON_SCALARS = st.one_of(st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8),
                         st.booleans(), st.none())
headers = st.builds(
    Header, st.binary(min_size=32, max_size=32), st.sampled_from([16, 24, 32]), st.integers(1, 0xFFFF),
    st.integers(1 << 16, 0xFFFFFFFF), st.text("abcdefghijklmnopqrstuvwxyz0123456789-", max_size=20),
    st.integers(1, 1 << 20), st.dictionaries(st.text(max_size=8), JSON_SCALARS, max_size=4),
    st.binary(max_size=100))
segments = st.lists(st.one_of(
    st.tuples(st.just(KIND_CODED), st.integers(1, 1000), st.binary(max_size=50), st.binary(max_size=50)),
    st.binary(max_size=50).map(lambda b: (KIND_RAW, 0, b, b))), max_size=6)


@settings(max_examples=60, deadline=None)
@given(headers, segments, st.integers(1, 40))
def test_random_containers_round_trip_when_fed_in_any_chunking(header: Header,
                                                               records: list[tuple[int, int, bytes, bytes]],
                                                               chunk: int) -> None:
    data = _container(header, records)
    reader = ContainerReader()
    items: list[Header | SegmentRecord | Trailer] = []
    for i in range(0, len(data), chunk):
        items += reader.feed(data[i:i + chunk])
    reader.close()
    trailer = Trailer(len(records), sum(len(r[2]) for r in records))
    assert items[0] == header and items[-1] == trailer
    parsed = [s for s in items if isinstance(s, SegmentRecord)]
    assert [(s.kind, s.tokens, s.payload) for s in parsed] == [(kind, tokens, payload)
                                                               for kind, tokens, _, payload in records]
    assert parse_container(data) == Container(header, parsed, trailer)


def test_reader_yields_each_record_as_soon_as_its_last_byte_arrives() -> None:
    reader = ContainerReader()
    completed_at = [i for i in range(len(SAMPLE)) if reader.feed(SAMPLE[i:i + 1])]
    reader.close()
    assert completed_at[0] == HEADER_LEN - 1
    assert completed_at[-1] == len(SAMPLE) - 1
    assert len(completed_at) == 5


def test_every_truncation_is_rejected() -> None:
    for n in range(len(SAMPLE)):
        with pytest.raises(ContainerError) as info:
            parse_container(SAMPLE[:n])
        assert info.value.code == "truncated_container"


def test_truncation_at_a_record_boundary_names_the_segments_read() -> None:
    cut = len(SAMPLE) - 7
    with pytest.raises(ContainerError, match="after 3 complete segment"):
        parse_container(SAMPLE[:cut])


def test_every_single_bit_flip_is_rejected() -> None:
    for i in range(len(SAMPLE)):
        for bit in range(8):
            damaged = bytearray(SAMPLE)
            damaged[i] ^= 1 << bit
            with pytest.raises(ContainerError):
                parse_container(bytes(damaged))


def test_a_damaged_segment_is_named_in_the_error() -> None:
    damaged = bytearray(SAMPLE)
    second_payload = HEADER_LEN + (1 + 3 + 3 + 4 + 4) + 2
    damaged[second_payload] ^= 0x40
    with pytest.raises(ContainerError, match="segment 1"):
        parse_container(bytes(damaged))


def test_trailing_garbage_wrong_magic_and_wrong_version_are_named() -> None:
    with pytest.raises(ContainerError, match="after the container") as info:
        parse_container(SAMPLE + b"x")
    assert info.value.code == "trailing_data"
    with pytest.raises(ContainerError, match="magic") as info:
        parse_container(b"ZZZZ" + SAMPLE[4:])
    assert info.value.code == "bad_magic"
    with pytest.raises(ContainerError, match="version") as info:
        parse_container(SAMPLE[:4] + bytes([VERSION + 1]) + SAMPLE[5:])
    assert info.value.code == "unsupported_version"


@pytest.mark.parametrize("version", [3, 4])
def test_both_readable_versions_round_trip_and_readers_hand_the_version_on(version: int) -> None:
    header = dataclasses.replace(HEADER, version=version)
    data = _container(header, SEGMENTS)
    assert data[4] == version
    parsed = parse_container(data)
    assert parsed.header == header and parsed.header.weighted_escapes == (version == 4)
    assert data[5:] == SAMPLE[5:] if version == VERSION else len(data) == len(SAMPLE)


def test_writers_write_version_4_and_refuse_a_version_no_reader_reads() -> None:
    assert VERSION == 4 and SAMPLE[4] == 4
    with pytest.raises(ValueError, match="version"):
        encode_header(dataclasses.replace(HEADER, version=5))


def test_version_2_containers_get_a_clear_error_that_names_the_version() -> None:
    with pytest.raises(ContainerError, match="version 2 containers were made by the float-kernel codec") as info:
        parse_container(SAMPLE[:4] + b"\x02" + SAMPLE[5:])
    assert info.value.code == "unsupported_version"


def test_framing_is_a_few_bytes_per_segment() -> None:
    """Varints: a coded segment's framing is its kind, three lengths and two CRCs."""
    writer = ContainerWriter(HEADER)
    writer.header_bytes()
    record = writer.segment_bytes(KIND_CODED, 16000, b"x" * 50000, b"p" * 6000)
    assert len(record) - 6000 == 1 + 2 + 3 + 2 + 4 + 4


def test_streaming_reader_rejects_a_foreign_stream_from_its_first_byte() -> None:
    with pytest.raises(ContainerError, match="magic"):
        ContainerReader().feed(b"P")


def test_huge_declared_sizes_fail_before_their_bytes_arrive() -> None:
    head = encode_header(HEADER)
    for payload_len, orig_len in ((2**32 - 1, 0), (0, 2**31)):
        hostile = head + bytes([KIND_CODED]) + varint(1) + varint(orig_len) + varint(payload_len)
        with pytest.raises(ContainerError, match="exceeds the limit") as info:
            ContainerReader().feed(hostile)
        assert info.value.code == "container_too_large"


def test_limits_on_segment_count_and_total_output_are_enforced() -> None:
    with pytest.raises(ContainerError, match="more than 2 segments"):
        parse_container(SAMPLE, Limits(max_segments=2))
    with pytest.raises(ContainerError, match="segment 2 takes the container's output over the limit"):
        parse_container(SAMPLE, Limits(max_total_original=5))
    with pytest.raises(ContainerError, match="context"):
        parse_container(SAMPLE, Limits(max_context=3))


@pytest.mark.parametrize("params", [b"[" * 60_000, b"[1, 2]", b"{\xff}", b"not json", b"1" * 5000])
def test_header_params_that_are_not_a_json_object_are_rejected(params: bytes) -> None:
    body = (b"CSCZ" + bytes([VERSION]) + b"\0" * 32 + varint(5) + b"exact" + bytes([32]) + varint(64)
            + varint(8192) + varint(100) + varint(len(params)) + params + varint(0))
    data = body + struct.pack("<I", zlib.crc32(body))
    reader = ContainerReader()
    [header] = reader.feed(data)  # the header comes out first, for the caller's identity checks (409 first)
    assert isinstance(header, Header) and header.defect and "params" in header.defect
    with pytest.raises(ContainerError, match="params"):
        reader.feed(b"")
    with pytest.raises(ContainerError, match="params"):
        reader.close()


def test_header_with_valid_checksum_but_impossible_parameters_is_rejected() -> None:
    data = bytearray(SAMPLE)
    data[4 + 1 + 32 + 1 + len(HEADER.numerics)] = 12
    with pytest.raises(ContainerError, match="coding parameters"):
        parse_container(_with_header_crc(bytes(data), HEADER_LEN))


@pytest.mark.parametrize("header", [
    Header(b"\0" * 31, 32, 64, 8192, "exact", 100),
    Header(b"\0" * 32, 12, 64, 8192, "exact", 100),
    Header(b"\0" * 32, 16, 70_000, 80_000, "exact", 100),
    Header(b"\0" * 32, 32, 8192, 8192, "exact", 100),
    Header(b"\0" * 32, 32, 64, 8192, "exäct", 100),
    Header(b"\0" * 32, 32, 64, 8192, "exact", 0),
    Header(b"\0" * 32, 32, 64, 8192, "exact", 100, {"t": float("nan")}),
])
def test_writer_refuses_headers_no_reader_would_accept(header: Header) -> None:
    with pytest.raises(ValueError):
        encode_header(header)


def test_writer_refuses_a_raw_segment_whose_payload_is_not_its_original() -> None:
    with pytest.raises(ValueError):
        ContainerWriter(HEADER).segment_bytes(KIND_RAW, 0, b"abc", b"abd")


def test_header_params_are_written_canonically() -> None:
    a = encode_header(Header(b"\0" * 32, 16, 8, 100, "exact", 50, {"b": 1, "a": [1, 2]}))
    b = encode_header(Header(b"\0" * 32, 16, 8, 100, "exact", 50, {"a": [1, 2], "b": 1}))
    assert a == b and json.dumps({"a": [1, 2], "b": 1}, separators=(",", ":")).encode() in a


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_only_ever_raise_container_error(data: bytes) -> None:
    with contextlib.suppress(ContainerError):
        parse_container(data)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, len(SAMPLE)), st.binary(max_size=60))
def test_valid_prefix_then_random_bytes_only_ever_raises_container_error(cut: int, junk: bytes) -> None:
    data = SAMPLE[:cut] + junk
    if data == SAMPLE:
        return
    with pytest.raises(ContainerError):
        parse_container(data)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, len(SAMPLE) - 1), st.binary(min_size=1, max_size=8))
def test_overwritten_bytes_are_rejected(at: int, junk: bytes) -> None:
    damaged = SAMPLE[:at] + junk + SAMPLE[at + len(junk):]
    if damaged == SAMPLE:
        damaged = SAMPLE[:at] + bytes([SAMPLE[at] ^ 1]) + SAMPLE[at + 1:]
    with pytest.raises(ContainerError):
        parse_container(damaged)


def _header_with_params(params: bytes) -> Header:
    body = (b"CSCZ" + bytes([VERSION]) + b"\0" * 32 + varint(5) + b"exact" + bytes([32]) + varint(64)
            + varint(8192) + varint(100) + varint(len(params)) + params + varint(0))
    header = ContainerReader().feed(body + struct.pack("<I", zlib.crc32(body)))[0]
    assert isinstance(header, Header)
    return header


@pytest.mark.parametrize(("params", "why"), [
    (b'{"separator_id":NaN}', "not canonical"), (b'{"separator_id": 1}', "not canonical"),
    (b'{"separator_id":1.0}', "this model's separator"), (b'{"separator_id":01}', "not canonical"),
    (b"", "not canonical"), (b'{"separator_id":2}', "this model's separator"), (b"{}", "this model's separator"),
    (b'{"separator_id":1,"x":0}', "this model's separator"), (b'{"separator_id":"1"}', "this model's separator"),
    (b'{"separator_id":true}', "this model's separator"),
])
def test_header_params_other_than_the_writers_are_a_damaged_container(params: bytes, why: str) -> None:
    try:
        header = _header_with_params(params)
    except ContainerError as exc:  # not even JSON: refused by the reader already
        assert exc.code == "corrupted_container"
        return
    with pytest.raises(ContainerError, match=f"damaged container: .*{why}") as caught:
        check_params(header, 1)
    assert caught.value.code == "damaged_container"


def test_the_writers_params_pass() -> None:
    check_params(_header_with_params(b'{"separator_id":1}'), 1)
    check_params(parse_container(_container(Header(b"\0" * 32, 16, 8, 100, "exact", 50, {"separator_id": 7}),
                                            [])).header, 7)


def _fits_decompress_limit(segments: list[tuple[int, int, bytes, bytes]], context: int) -> None:
    from cascade.settings import Settings

    header = dataclasses.replace(HEADER, params={"separator_id": 2 ** 31}, context=b"c" * context)
    container = _container(header, segments)
    limits = Settings(codec_max_input_bytes=sum(len(s[2]) for s in segments), codec_max_segments=len(segments),
                      codec_max_context_bytes=context)  # type: ignore[call-arg]
    assert len(container) <= limits.codec_max_container_bytes


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=60), st.integers(0, 2000))
def test_every_container_of_an_input_within_the_limits_fits_the_decompress_limit(sizes: list[int],
                                                                                context: int) -> None:
    """``/decompress`` reads any container of an input ``/compress`` takes: the input stored raw
    (coded segments are kept only when shorter), plus the framing, within ``codec_max_container_bytes``."""
    _fits_decompress_limit([(KIND_RAW, 0, b"\xff" * size, b"\xff" * size) for size in sizes], context)


def test_segments_whose_lengths_take_four_byte_varints_fit_the_decompress_limit() -> None:
    big = b"\xff" * ((1 << 21) + 1)
    _fits_decompress_limit([(KIND_RAW, 0, big, big), (KIND_RAW, 0, b"x", b"x")], 65536)
