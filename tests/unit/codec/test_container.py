"""Container: round trips, and every truncation, bit flip or hostile size fails with ContainerError."""

from __future__ import annotations

import contextlib
import struct
import time

import pytest
from cascade.codec.container import (
    KIND_CODED,
    KIND_RAW,
    ContainerError,
    ContainerReader,
    ContainerWriter,
    Header,
    parse_container,
)
from hypothesis import given, settings
from hypothesis import strategies as st

HEADER = Header(b"\x07" * 32, 32, 64, 8192, "float32", {"separator_id": 1}, "ctx ✓".encode())


def _container(segments: list[tuple[int, bytes, bytes]]) -> bytes:
    writer = ContainerWriter(HEADER)
    data = writer.header_bytes()
    for kind, original, payload in segments:
        data += writer.segment_bytes(kind, 3 if kind == KIND_CODED else 0, original, payload)
    return data + writer.trailer_bytes()


SAMPLE = _container([(KIND_CODED, b"abc", b"\x01\x02\x03"), (KIND_RAW, b"\xff\xfe", b"\xff\xfe"),
                     (KIND_CODED, "é".encode(), b"\x09")])


def test_container_round_trips_header_and_segments() -> None:
    header, segments = parse_container(SAMPLE)
    assert header == HEADER
    assert [(s.kind, s.original_length, s.payload) for s in segments] == [
        (KIND_CODED, 3, b"\x01\x02\x03"), (KIND_RAW, 2, b"\xff\xfe"), (KIND_CODED, 2, b"\x09")]


def test_incremental_feed_matches_whole_parse() -> None:
    reader = ContainerReader()
    items = []
    for i in range(len(SAMPLE)):
        items += list(reader.feed(SAMPLE[i:i + 1]))
    reader.close()
    assert len(items) == 5


def test_every_truncation_is_rejected() -> None:
    for n in range(len(SAMPLE)):
        with pytest.raises(ContainerError):
            parse_container(SAMPLE[:n])


def test_every_single_bit_flip_is_rejected() -> None:
    for i in range(len(SAMPLE)):
        for bit in range(8):
            damaged = bytearray(SAMPLE)
            damaged[i] ^= 1 << bit
            with pytest.raises(ContainerError):
                parse_container(bytes(damaged))


def test_trailing_garbage_wrong_magic_and_version_are_named() -> None:
    with pytest.raises(ContainerError, match="after the container"):
        parse_container(SAMPLE + b"x")
    with pytest.raises(ContainerError, match="magic"):
        parse_container(b"ZZZZ" + SAMPLE[4:])
    with pytest.raises(ContainerError, match="version"):
        parse_container(SAMPLE[:4] + b"\x09" + SAMPLE[5:])


def test_huge_declared_sizes_fail_fast_without_allocating() -> None:
    writer = ContainerWriter(HEADER)
    head = writer.header_bytes()
    hostile = head + struct.pack("<cBIIII", b"S", KIND_CODED, 1, 2**31, 0, 2**32 - 1)
    start = time.monotonic()
    with pytest.raises(ContainerError, match="over the limit"):
        parse_container(hostile)
    assert time.monotonic() - start < 0.1


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_never_crash_the_parser(data: bytes) -> None:
    with contextlib.suppress(ContainerError):
        parse_container(data)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, len(SAMPLE) - 1), st.binary(min_size=1, max_size=8))
def test_spliced_containers_are_rejected(at: int, junk: bytes) -> None:
    with pytest.raises(ContainerError):
        parse_container(SAMPLE[:at] + junk + SAMPLE[at + len(junk):] if SAMPLE[at:at + len(junk)] != junk
                        else SAMPLE[:at] + bytes([junk[0] ^ 1]) + SAMPLE[at + 1:])
