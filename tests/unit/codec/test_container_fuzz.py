"""Hypothesis fuzz of the container parser and of the coder's decode step with hostile input.

The plain fuzz in ``test_container.py`` mostly dies at the first checksum. Here the generator builds
containers whose checksums are *right* but whose declared sizes, counts, kinds and coding parameters
are hostile (huge lengths, segment counts over the limits, nested JSON, lying trailers), then
truncates, bit-flips and re-chunks them. Every input must end in ``ContainerError`` (or parse, for
inputs that are in fact valid) — never another exception — quickly and with memory bounded by the
input's real size, not by what it claims. The decode-step fuzz feeds random payloads to the lane
decoder the exact runner steps: they decode to tokens or stop with ``PayloadOverrunError``, nothing else.
"""

from __future__ import annotations

import json
import struct
import tracemalloc
import zlib
from collections import Counter

import numpy as np
import torch
from cascade.codec.container import (
    KIND_CODED,
    KIND_RAW,
    MAGIC,
    VERSION,
    Container,
    ContainerError,
    ContainerReader,
    ContainerWriter,
    Header,
    Limits,
    parse_container,
    varint,
)
from cascade.codec.exact.frequencies import ESCAPE_BITS, frequency_tables
from cascade.codec.exact.runner import escaped_token
from cascade.codec.lanes import LaneDecoder
from cascade.codec.range_coder import MAX_OVERRUN, PayloadOverrunError
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

TRIED: Counter[str] = Counter()
OUTCOMES: Counter[str] = Counter()
FUZZ = settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.data_too_large])
HUGE = st.sampled_from([0xFFFFFFFF, 0x80000000, 1 << 30, (1 << 26) + 1, (1 << 20) + 1, 65536])


def usually(value: int, other: st.SearchStrategy[int]) -> st.SearchStrategy[int]:
    """``value`` most of the time (so parsing gets deep), ``other`` otherwise."""
    return st.integers(0, 5).flatmap(lambda roll: st.just(value) if roll else other)


def _crc(body: bytes) -> bytes:
    return body + struct.pack("<I", zlib.crc32(body))


def _valid(segments: int) -> bytes:
    """A well-formed container, so every run also takes the parser's success path."""
    writer = ContainerWriter(Header(b"\1" * 32, 32, 64, 8192, "exact-llama-1", 1000, {"separator_id": 1}, b"ctx"))
    data = writer.header_bytes()
    for i in range(segments):
        original = b"seg%d" % i
        data += (writer.segment_bytes(KIND_RAW, 0, original, original) if i % 2
                 else writer.segment_bytes(KIND_CODED, i + 1, original, b"\x5a" * (i + 1)))
    return data + writer.trailer_bytes()


@st.composite
def header_bytes(draw: st.DrawFn) -> bytes:
    precision = draw(usually(32, st.integers(0, 255)))
    top_k = draw(usually(64, st.integers(0, 0xFFFF)))
    vocab = draw(usually(8192, st.integers(0, 0xFFFFFFFF)))
    lane = draw(usually(1000, st.integers(0, 1 << 40)))
    numerics = draw(st.one_of(st.just(b"exact-llama-1"), st.binary(max_size=20)))
    params = draw(st.one_of(
        st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3).map(
            lambda d: json.dumps(d).encode()),
        st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n),
        st.integers(1, 3000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
        st.binary(max_size=40)))
    context = draw(st.binary(max_size=30))
    numerics_len = draw(usually(len(numerics), st.integers(0, 300)))
    params_len = draw(usually(len(params), st.integers(0, 0xFFFF)))
    context_len = draw(usually(len(context), HUGE | st.integers(0, 64)))
    body = (MAGIC + bytes([VERSION]) + draw(st.binary(min_size=32, max_size=32)) + varint(numerics_len) + numerics
            + bytes([precision]) + varint(top_k) + varint(vocab) + varint(lane) + varint(params_len) + params
            + varint(context_len) + context)
    return _crc(body) if draw(st.booleans()) or draw(st.booleans()) else body + draw(st.binary(min_size=4,
                                                                                               max_size=4))


@st.composite
def segment_bytes(draw: st.DrawFn) -> tuple[bytes, int]:
    kind = draw(usually(0, st.integers(0, 255)))
    kind = 1 if kind == 0 and draw(st.booleans()) else kind
    original = draw(st.binary(max_size=24))
    payload = original if kind == 1 and draw(st.booleans()) else draw(st.binary(max_size=24))
    tokens = draw(st.one_of(st.integers(0, 40), st.integers(0, 0xFFFFFFFF)))
    orig_len = draw(usually(len(original), HUGE | st.integers(0, 64)))
    payload_len = draw(usually(len(payload), HUGE | st.integers(0, 64)))
    orig_crc = zlib.crc32(original) if draw(st.booleans()) else draw(st.integers(0, 0xFFFFFFFF))
    if kind == 1:
        record = bytes([kind]) + varint(orig_len) + payload
    else:
        record = (bytes([kind & 0xFF]) + varint(tokens) + varint(orig_len) + varint(payload_len) + payload
                  + struct.pack("<I", orig_crc))
    return (_crc(record) if draw(st.integers(0, 7)) else record + b"\0\0\0\0"), orig_len


@st.composite
def hostile_container(draw: st.DrawFn) -> bytes:
    data = draw(header_bytes())
    total = 0
    segments = draw(st.lists(segment_bytes(), max_size=6))
    for record, orig_len in segments:
        data += record
        total += orig_len
    count = draw(usually(len(segments), st.integers(0, 0xFFFFFFFF)))
    total = draw(usually(total & ((1 << 64) - 1), st.integers(0, (1 << 64) - 1)))
    trailer = draw(st.sampled_from([b"E", b"E", b"E", b"\0", b"X"])) + varint(count) + varint(total)
    data += trailer + struct.pack("<I", zlib.crc32(data + trailer) if draw(st.integers(0, 4)) else 0)
    mutation = draw(st.sampled_from(["none", "none", "none", "truncate", "flip", "append", "splice"]))
    if mutation == "truncate" and data:
        data = data[:draw(st.integers(0, len(data) - 1))]
    elif mutation == "flip" and data:
        at = draw(st.integers(0, len(data) - 1))
        data = data[:at] + bytes([data[at] ^ (1 << draw(st.integers(0, 7)))]) + data[at + 1:]
    elif mutation == "append":
        data += draw(st.binary(min_size=1, max_size=16))
    elif mutation == "splice" and data:
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.binary(min_size=1, max_size=12)) + data[at:]
    return data


LIMITS = st.one_of(st.just(Limits()), st.builds(Limits, max_segments=st.integers(1, 8),
                                                 max_payload=st.integers(0, 64), max_original=st.integers(0, 64),
                                                 max_total_original=st.integers(0, 200),
                                                 max_context=st.integers(0, 40), max_params=st.integers(0, 200)))


def _parse_chunked(data: bytes, limits: Limits, cuts: list[int]) -> Container | None:
    reader = ContainerReader(limits)
    last = 0
    for cut in sorted(c % (len(data) + 1) for c in cuts):
        reader.feed(data[last:cut])
        last = cut
    reader.feed(data[last:])
    reader.close()
    return parse_container(data, limits)


def _check(kind: str, data: bytes, limits: Limits, cuts: list[int]) -> None:
    TRIED[kind] += 1
    tracemalloc.start()
    try:
        parsed = _parse_chunked(data, limits, cuts)
    except ContainerError as exc:
        OUTCOMES[exc.code] += 1
        assert exc.code in {"bad_magic", "unsupported_version", "truncated_container", "corrupted_container",
                            "container_too_large", "trailing_data"}
    else:
        OUTCOMES["parsed"] += 1
        assert parsed is not None and parsed.trailer.segments == len(parsed.segments) <= limits.max_segments
        assert sum(s.original_length for s in parsed.segments) <= limits.max_total_original
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    # Memory follows the bytes actually given (a few copies while chunking), never a declared size
    # (declared sizes reach gigabytes); the constant covers one-off allocations tracemalloc also sees.
    assert peak < 8 * len(data) + (2 << 20), f"{kind}: peak {peak} for {len(data)} input bytes"


@FUZZ
@given(hostile_container(), LIMITS, st.lists(st.integers(0, 1 << 16), max_size=4))
@example(_valid(0), Limits(), [])
@example(_valid(3), Limits(), [5, 40])
def test_hostile_containers_with_valid_checksums_only_raise_container_error(data: bytes, limits: Limits,
                                                                           cuts: list[int]) -> None:
    _check("structured", data, limits, cuts)


@FUZZ
@given(st.binary(max_size=2000), LIMITS, st.lists(st.integers(0, 1 << 16), max_size=3))
def test_random_bytes_behind_a_valid_magic_only_raise_container_error(tail: bytes, limits: Limits,
                                                                     cuts: list[int]) -> None:
    _check("magic+random", MAGIC + bytes([VERSION]) + tail, limits, cuts)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=4000), st.lists(st.integers(0, 1 << 16), max_size=3))
def test_random_bytes_only_raise_container_error(data: bytes, cuts: list[int]) -> None:
    _check("random", data, Limits(), cuts)


def _head(params: bytes = b"{}", context_len: int = 0, params_len: int | None = None) -> bytes:
    return (MAGIC + bytes([VERSION]) + b"\0" * 32 + varint(5) + b"exact" + bytes([32]) + varint(64) + varint(8192)
            + varint(1000) + varint(len(params) if params_len is None else params_len) + params + varint(context_len))


@settings(max_examples=300, deadline=None)
@given(HUGE, HUGE, st.integers(0, 0xFFFF))
def test_huge_declared_header_and_segment_sizes_fail_without_allocating_them(context_len: int, payload_len: int,
                                                                            params_len: int) -> None:
    forged = _head(b"{}"[:params_len], context_len, params_len)
    _check("huge_header", forged, Limits(max_params=1024), [])
    segment = bytes([0]) + varint(3) + varint(payload_len) + varint(payload_len)
    _check("huge_segment", _crc(_head()) + segment, Limits(), [])


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 5000))
def test_more_segments_than_the_limit_fail_at_the_first_one_over(count: int) -> None:
    record = _crc(bytes([1]) + varint(1) + b"a")
    data = _crc(_head()) + record * count
    limit = max(1, count // 2)
    TRIED["segment_count"] += 1
    reader = ContainerReader(Limits(max_segments=limit))
    try:
        reader.feed(data)
    except ContainerError as exc:
        assert exc.code == "container_too_large" and reader.segments == limit
    else:
        assert count <= limit


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.lists(st.integers(1, 30), min_size=1, max_size=6), st.integers(2, 9000),
       st.integers(1, 64), st.sampled_from([16, 24, 32]), st.integers(0, 2**32 - 1), st.booleans())
def test_decoding_random_payloads_gives_tokens_or_an_overrun_error(payload: bytes, lengths: list[int], vocab: int,
                                                                   k: int, precision: int, seed: int,
                                                                   weighted: bool) -> None:
    """What the exact runner does with a forged payload: any bytes decode to *some* in-vocabulary tokens,
    lane by lane (the segment's CRC then rejects them), or stop with ``PayloadOverrunError`` once the
    decoder reads past the payload further than a valid stream ever is — never another exception.
    Escapes as both container versions code them (``weighted``: version 4)."""
    TRIED["decode_step"] += 1
    try:
        _decode_random(payload, lengths, vocab, k, precision, seed, weighted)
    except PayloadOverrunError as exc:
        OUTCOMES["payload_overrun"] += 1
        assert exc.read_past == MAX_OVERRUN + 1 and exc.tokens is not None and exc.tokens >= 0


def _decode_random(payload: bytes, lengths: list[int], vocab: int, k: int, precision: int, seed: int,
                   weighted: bool) -> None:
    rng = np.random.default_rng(seed)
    k = min(k, vocab - 1)
    decoder = LaneDecoder(payload, precision, 1 << ESCAPE_BITS if weighted else vocab - k)
    for t in range(max(lengths)):
        for n in lengths:
            if t >= n:
                continue
            logits = torch.from_numpy(rng.integers(-(30 << 16), 30 << 16, size=(1, vocab)))
            ids, cdf = frequency_tables(logits, k, precision)
            row = cdf[0].numpy()
            symbol = min(max(int(np.searchsorted(row, decoder.target(), side="right")) - 1, 0), k)
            decoder.consume(int(row[symbol]), int(row[symbol + 1] - row[symbol]))
            token = int(ids[0, symbol]) if symbol < k else escaped_token(decoder, logits, ids[0].numpy(), weighted)
            assert 0 <= token < vocab


def test_fuzz_counts_are_reported() -> None:
    """Runs last: prints how many inputs the fuzzers above tried and how they ended."""
    print(f"\ncontainer fuzz: {sum(TRIED.values())} inputs {dict(TRIED)}; outcomes {dict(OUTCOMES)}")
    if TRIED:  # when the module ran as a whole
        assert TRIED["structured"] >= 1000 and OUTCOMES["parsed"] > 0
