"""Hypothesis fuzz of the container parser and of the coder's decode step with hostile input.

The plain fuzz in ``test_container.py`` mostly dies at the first checksum. Here the generator builds
containers whose checksums are *right* but whose declared sizes, counts, kinds and coding parameters
are hostile (huge lengths, segment counts over the limits, nested JSON, lying trailers), then
truncates, bit-flips and re-chunks them. Every input must end in ``ContainerError`` (or parse, for
inputs that are in fact valid) — never another exception — quickly and with memory bounded by the
input's real size, not by what it claims. The decode-step fuzz feeds random payloads to the range
decoder the codec's logits processor runs inside the engine, where an exception would kill the
engine process.
"""

from __future__ import annotations

import json
import struct
import time
import tracemalloc
import zlib
from collections import Counter

import numpy as np
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
)
from cascade.codec.range_coder import Decoder
from cascade.codec.topk_coding import decode_next_token
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
    writer = ContainerWriter(Header(b"\1" * 32, 32, 64, 8192, "float32", {"separator_id": 1}, b"ctx"))
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
    dtype = draw(st.one_of(st.just(b"float32"), st.binary(max_size=20)))
    params = draw(st.one_of(
        st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3).map(
            lambda d: json.dumps(d).encode()),
        st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n),
        st.integers(1, 3000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
        st.binary(max_size=40)))
    context = draw(st.binary(max_size=30))
    head = struct.pack("<4sB32sBHI", MAGIC, VERSION, draw(st.binary(min_size=32, max_size=32)), precision, top_k,
                       vocab)
    params_len = draw(usually(len(params), st.integers(0, 0xFFFF)))
    context_len = draw(usually(len(context), HUGE | st.integers(0, 64)))
    body = (head + bytes([len(dtype)]) + dtype + struct.pack("<H", params_len) + params
            + struct.pack("<I", context_len) + context)
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
    record = struct.pack("<cBIIII", b"S", kind, tokens, orig_len, orig_crc, payload_len) + payload
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
    trailer = struct.pack("<cIQ", draw(st.sampled_from([b"E", b"E", b"E", b"S", b"X"])), count, total)
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
    started = time.monotonic()
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
    elapsed = time.monotonic() - started
    assert elapsed < 0.5, f"{kind}: {elapsed:.3f}s"
    # Memory follows the bytes actually given (a few copies while chunking), never a declared size.
    assert peak < 8 * len(data) + (1 << 20), f"{kind}: peak {peak} for {len(data)} input bytes"


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


@settings(max_examples=300, deadline=None)
@given(HUGE, HUGE, st.integers(0, 0xFFFF))
def test_huge_declared_header_and_segment_sizes_fail_without_allocating_them(context_len: int, payload_len: int,
                                                                            params_len: int) -> None:
    head = struct.pack("<4sB32sBHI", MAGIC, VERSION, b"\0" * 32, 32, 64, 8192) + b"\x07float32"
    forged = head + struct.pack("<H", params_len) + b"{}"[:params_len] + struct.pack("<I", context_len)
    _check("huge_header", forged, Limits(max_params=1024), [])
    valid = _crc(head + struct.pack("<H", 2) + b"{}" + struct.pack("<I", 0))
    segment = struct.pack("<cBIIII", b"S", 0, 3, payload_len, 0, payload_len)
    _check("huge_segment", valid + segment, Limits(), [])


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 5000))
def test_more_segments_than_the_limit_fail_at_the_first_one_over(count: int) -> None:
    valid = _crc(struct.pack("<4sB32sBHI", MAGIC, VERSION, b"\0" * 32, 32, 64, 8192) + b"\x07float32"
                 + struct.pack("<H", 2) + b"{}" + struct.pack("<I", 0))
    record = _crc(struct.pack("<cBIIII", b"S", 1, 0, 1, zlib.crc32(b"a"), 1) + b"a")
    data = valid + record * count
    limit = max(1, count // 2)
    TRIED["segment_count"] += 1
    reader = ContainerReader(Limits(max_segments=limit))
    try:
        reader.feed(data)
    except ContainerError as exc:
        assert exc.code == "container_too_large" and reader.segments == limit
    else:
        assert count <= limit


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=64), st.integers(2, 9000), st.integers(1, 64), st.sampled_from([16, 24, 32]),
       st.integers(0, 2**32 - 1))
def test_decoding_random_payloads_never_raises(payload: bytes, vocab: int, k: int, precision: int,
                                               seed: int) -> None:
    """What the codec logits processor does inside the engine: any bytes decode to *some* tokens."""
    TRIED["decode_step"] += 1
    rng = np.random.default_rng(seed)
    k = min(k, vocab)
    decoder = Decoder(payload)
    for _ in range(24):
        ids = rng.choice(vocab, size=k, replace=False).tolist()
        logprobs = np.sort(rng.uniform(-40, 0, size=k))[::-1].tolist()
        token = decode_next_token(decoder, ids, logprobs, vocab, precision)
        assert 0 <= token < vocab


def test_fuzz_counts_are_reported() -> None:
    """Runs last: prints how many inputs the fuzzers above tried and how they ended."""
    print(f"\ncontainer fuzz: {sum(TRIED.values())} inputs {dict(TRIED)}; outcomes {dict(OUTCOMES)}")
    if TRIED:  # when the module ran as a whole
        assert TRIED["structured"] >= 1000 and OUTCOMES["parsed"] > 0
