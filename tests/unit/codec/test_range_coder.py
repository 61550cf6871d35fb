"""Range coder: exact round trips for any intervals and totals, streaming, carries, bounded decoding."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

import pytest
from cascade.codec.range_coder import (
    MAX_OVERRUN,
    MAX_STRIPPED_ZEROS,
    MAX_TOTAL,
    TOP,
    Decoder,
    Encoder,
    PayloadOverrunError,
)
from hypothesis import given, settings
from hypothesis import strategies as st

Symbol = tuple[int, int, int]


@st.composite
def intervals(draw: st.DrawFn, total: int) -> tuple[int, int]:
    """An interval of ``total``, biased to the edges and to tiny widths, where carries and underflow live."""
    shape = draw(st.sampled_from(["top", "bottom", "tiny", "any"]))
    if shape == "top":
        freq = draw(st.integers(1, max(1, min(total, 4))))
        return total - freq, freq
    if shape == "bottom":
        return 0, draw(st.integers(1, total))
    low = draw(st.integers(0, total - 1))
    freq = 1 if shape == "tiny" else draw(st.integers(1, total - low))
    return low, freq


@st.composite
def power_of_two_symbols(draw: st.DrawFn, precision: int) -> Symbol:
    low, freq = draw(intervals(1 << precision))
    return low, freq, precision


@st.composite
def any_total_symbols(draw: st.DrawFn) -> Symbol:
    total = draw(st.one_of(st.integers(1, 300), st.integers(1, MAX_TOTAL),
                           st.sampled_from([MAX_TOTAL - 1, MAX_TOTAL])))
    low, freq = draw(intervals(total))
    return low, freq, -total


def _encode(symbols: list[Symbol]) -> list[bytes]:
    """Streamed output, one chunk per symbol plus the flush; a negative third field is an explicit total."""
    encoder = Encoder()
    chunks = [encoder.encode(low, freq, p) if p >= 0 else encoder.encode_with_total(low, freq, -p)
              for low, freq, p in symbols]
    return [*chunks, encoder.finish()]


def _decode(decoder: Decoder, symbols: list[Symbol]) -> None:
    for low, freq, p in symbols:
        if p >= 0:
            target = decoder.decode_target(p)
            assert low <= target < low + freq
            decoder.consume(low, freq, p)
        else:
            target = decoder.decode_target_with_total(-p)
            assert low <= target < low + freq
            decoder.consume_with_total(low, freq, -p)


def _chunked(data: bytes, sizes: list[int]) -> Iterator[bytes]:
    pos = 0
    for size in sizes:
        yield data[pos:pos + size]
        pos += size
    yield data[pos:]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([16, 24, 32]).flatmap(lambda p: st.lists(power_of_two_symbols(p), max_size=120)),
       st.lists(st.integers(0, 7), max_size=20))
def test_symbol_sequences_round_trip_at_each_precision_with_streamed_output(symbols: list[Symbol],
                                                                            chunk_sizes: list[int]) -> None:
    stream = b"".join(_encode(symbols))
    _decode(Decoder(_chunked(stream, chunk_sizes)), symbols)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(power_of_two_symbols(16), power_of_two_symbols(24), power_of_two_symbols(32),
                          power_of_two_symbols(0), any_total_symbols()), max_size=120))
def test_mixed_precisions_and_arbitrary_totals_share_one_stream(symbols: list[Symbol]) -> None:
    _decode(Decoder(b"".join(_encode(symbols))), symbols)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([16, 24, 32]).flatmap(
    lambda p: st.lists(power_of_two_symbols(p), min_size=1, max_size=60)))
def test_power_of_two_precision_codes_exactly_like_the_same_explicit_total(symbols: list[Symbol]) -> None:
    assert _encode(symbols) == _encode([(low, freq, -(1 << p)) for low, freq, p in symbols])


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([16, 24, 32]).flatmap(lambda p: st.lists(power_of_two_symbols(p), max_size=200)))
def test_code_length_stays_within_two_bytes_of_the_ideal(symbols: list[Symbol]) -> None:
    ideal = sum(p - math.log2(freq) for _, freq, p in symbols)
    assert 8 * len(b"".join(_encode(symbols))) <= ideal + 16 + 1e-6 * len(symbols)


class _ShiftCountingEncoder(Encoder):
    __slots__ = ("shifts",)

    def __init__(self) -> None:
        super().__init__()
        self.shifts = 0

    def _shift(self) -> None:
        self.shifts += 1
        super()._shift()


class _CarryCountingEncoder(Encoder):
    __slots__ = ("carries",)

    def __init__(self) -> None:
        super().__init__()
        self.carries = 0

    def _shift(self) -> None:
        self.carries += self._low >= TOP
        super()._shift()


def test_carries_through_runs_of_ff_bytes_round_trip() -> None:
    rng = random.Random(7)
    symbols: list[Symbol] = []
    for _ in range(3000):
        if rng.random() < 0.6:
            symbols.append(((1 << 16) - 1, 1, 16))
        else:
            low = rng.randrange(1 << 16)
            symbols.append((low, rng.randint(1, (1 << 16) - low), 16))
    encoder = _CarryCountingEncoder()
    stream = b"".join(encoder.encode(low, freq, p) for low, freq, p in symbols) + encoder.finish()
    assert encoder.carries > 0
    assert b"\xff\xff" in stream
    _decode(Decoder(stream), symbols)


def test_an_empty_stream_is_empty_and_decodes() -> None:
    assert Encoder().finish() == b""
    decoder = Decoder(b"")
    assert decoder.decode_target(16) == 0


def test_decoder_pulls_chunks_only_as_it_needs_them() -> None:
    symbols = [(0, 1, 32)] * 40
    stream = b"".join(_encode(symbols))
    pulled = 0

    def chunks() -> Iterator[bytes]:
        nonlocal pulled
        for i in range(len(stream)):
            pulled += 1
            yield stream[i:i + 1]

    decoder = Decoder(chunks())
    assert pulled == 8
    _decode(decoder, symbols[:4])
    assert pulled < len(stream)


def test_a_truncated_stream_fails_within_the_overrun_bound() -> None:
    symbols = [(i % 1000, 7, 16) for i in range(500)]
    stream = b"".join(_encode(symbols))
    decoder = Decoder(stream[:len(stream) // 3])
    decoded = 0
    with pytest.raises(PayloadOverrunError):
        for low, freq, p in symbols:
            decoder.decode_target(p)
            decoder.consume(low, freq, p)
            decoded += 1
    assert decoder.padded_bytes == MAX_OVERRUN + 1
    assert decoded < len(symbols) // 2


def test_an_unbounded_decoder_reads_zero_padding_past_a_short_stream() -> None:
    symbols = [(i % 1000, 7, 16) for i in range(500)]
    stream = b"".join(_encode(symbols))
    decoder = Decoder(stream[:len(stream) // 3], max_overrun=None)
    for low, freq, p in symbols:
        decoder.decode_target(p)
        decoder.consume(low, freq, p)
    assert decoder.padded_bytes > MAX_OVERRUN


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=200), st.lists(st.tuples(st.integers(1, 60), st.integers(1, 1 << 20)), max_size=30))
def test_garbage_input_decodes_or_overruns_never_anything_else(data: bytes, steps: list[tuple[int, int]]) -> None:
    decoder = Decoder(data)
    try:
        for _ in range(20):
            for freq, total in steps:
                target = decoder.decode_target_with_total(total)
                low = min(target, total - 1)
                decoder.consume_with_total(low, min(freq, total - low), total)
                target = decoder.decode_target(24)
                assert 0 <= target < 1 << 24
                decoder.consume(target, 1, 24)
    except PayloadOverrunError:
        assert decoder.padded_bytes == MAX_OVERRUN + 1
    assert decoder.padded_bytes <= MAX_OVERRUN + 1


def _overrun_after(symbols: list[Symbol], stream: bytes) -> int:
    decoder = Decoder(stream)
    _decode(decoder, symbols)
    return decoder.padded_bytes


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(power_of_two_symbols(16), power_of_two_symbols(24), power_of_two_symbols(32),
                          any_total_symbols()), max_size=150))
def test_a_valid_stream_is_read_exactly_seven_plus_its_dropped_zeros_past_its_end(symbols: list[Symbol]) -> None:
    encoder = _ShiftCountingEncoder()
    stream = b"".join(encoder.encode(low, freq, p) if p >= 0 else encoder.encode_with_total(low, freq, -p)
                      for low, freq, p in symbols)
    shifts = encoder.shifts
    stream += encoder.finish()
    dropped = shifts + 1 - len(stream)
    assert 0 <= dropped <= MAX_STRIPPED_ZEROS
    assert _overrun_after(symbols, stream) == 7 + dropped <= MAX_OVERRUN


def _symbols_a_decoder_picks(payload: bytes, count: int, seed: int) -> list[Symbol]:
    """Symbols chosen by decoding ``payload`` past its end under random tables: the code value has a
    short expansion, so the encoder's interval keeps straddling it and the stream ends in a long run
    of pending 0xFF bytes that ``finish``'s carry turns into zeros — the case the zero cap is for."""
    rng = random.Random(seed)
    decoder = Decoder(payload, max_overrun=None)
    symbols: list[Symbol] = []
    for _ in range(count):
        precision = rng.choice([16, 24, 32])
        cuts = sorted({0, 1 << precision, *(rng.randrange(1, 1 << precision) for _ in range(5))})
        target = decoder.decode_target(precision)
        low = max(c for c in cuts if c <= target)
        high = min(c for c in cuts if c > target)
        decoder.consume(low, high - low, precision)
        symbols.append((low, high - low, precision))
        if rng.random() < 0.2:
            total = rng.randint(2, MAX_TOTAL)
            rank = decoder.decode_target_with_total(total)
            decoder.consume_with_total(rank, 1, total)
            symbols.append((rank, 1, -total))
    return symbols


@pytest.mark.parametrize("seed", range(12))
def test_symbols_that_keep_straddling_a_short_code_value_still_stay_within_the_bound(seed: int) -> None:
    symbols = _symbols_a_decoder_picks(bytes([0x80 + seed]), 400, seed)
    stream = b"".join(_encode(symbols))
    assert _overrun_after(symbols, stream) <= MAX_OVERRUN
    every_zero_dropped = Decoder(stream.rstrip(b"\0"), max_overrun=None)  # release ddd10e1's finish
    _decode(every_zero_dropped, symbols)
    assert every_zero_dropped.padded_bytes > 10 * MAX_OVERRUN


@pytest.mark.parametrize(("low", "freq", "total"), [(0, 0, 16), (-1, 2, 16), (10, 7, 16), (0, 1, 0),
                                                    (0, 1, MAX_TOTAL + 1)])
def test_invalid_intervals_are_rejected(low: int, freq: int, total: int) -> None:
    with pytest.raises(ValueError):
        Encoder().encode_with_total(low, freq, total)
    with pytest.raises(ValueError):
        Decoder(b"").consume_with_total(low, freq, total)


def test_precision_above_thirty_two_bits_is_rejected() -> None:
    with pytest.raises(ValueError):
        Encoder().encode(0, 1, 33)
    with pytest.raises(ValueError):
        Decoder(b"").decode_target(33)
