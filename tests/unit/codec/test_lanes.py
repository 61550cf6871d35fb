"""Lanes: one interleaved range-coded stream that a lock-step batched decoder reads back exactly."""

from __future__ import annotations

import random

import pytest
from cascade.codec.lanes import LaneDecoder, LaneSymbols, encode_lanes, lane_lengths, split_lanes
from hypothesis import given, settings
from hypothesis import strategies as st


@given(st.integers(0, 5000), st.integers(1, 700))
def test_lane_lengths_cover_the_tokens_with_full_lanes_then_the_rest(tokens: int, lane: int) -> None:
    lengths = lane_lengths(tokens, lane)
    assert sum(lengths) == tokens
    assert all(n == lane for n in lengths[:-1]) and all(1 <= n <= lane for n in lengths)
    assert [len(x) for x in split_lanes(list(range(tokens)), lane)] == lengths


def test_lane_lengths_refuse_nonsense() -> None:
    with pytest.raises(ValueError):
        lane_lengths(5, 0)


def _random_lane(rng: random.Random, length: int, precision: int, fallback: int) -> tuple[LaneSymbols, list[list[int]]]:
    """A lane's symbols plus, per position, the CDF the decoder would be given (top-3 + escape); an
    escape's fallback interval is any part of ``fallback`` (a uniform rank: width 1)."""
    lows, freqs, fallback_lows, fallback_freqs, cdfs = [], [], [], [], []
    for _ in range(length):
        cuts = sorted(rng.sample(range(1, 1 << precision), 3))
        cdf = [0, *cuts, 1 << precision]
        symbol = rng.randrange(4)
        lows.append(cdf[symbol])
        freqs.append(cdf[symbol + 1] - cdf[symbol])
        low = rng.randrange(fallback) if symbol == 3 else -1
        fallback_lows.append(low)
        fallback_freqs.append(rng.choice([1, rng.randint(1, fallback - low)]) if symbol == 3 else 1)
        cdfs.append(cdf)
    return LaneSymbols(lows, freqs, fallback_lows, fallback_freqs, fallback), cdfs


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=9), st.sampled_from([16, 24, 32]), st.integers(0, 10**6))
def test_interleaved_lanes_decode_in_lock_step(lengths: list[int], precision: int, seed: int) -> None:
    rng = random.Random(seed)
    fallback = rng.choice([rng.randint(2, 5000), 1 << 32])
    lanes = [_random_lane(rng, n, precision, fallback) for n in lengths]
    payload = encode_lanes([symbols for symbols, _ in lanes], precision)
    decoder = LaneDecoder(payload, precision, fallback)
    for t in range(max(lengths)):
        for symbols, cdfs in lanes:
            if t >= len(symbols.low):
                continue
            target = decoder.target()
            cdf = cdfs[t]
            symbol = max(i for i in range(4) if cdf[i] <= target)
            assert (cdf[symbol], cdf[symbol + 1] - cdf[symbol]) == (symbols.low[t], symbols.freq[t])
            decoder.consume(cdf[symbol], cdf[symbol + 1] - cdf[symbol])
            if symbol == 3:
                low, freq = symbols.fallback_low[t], symbols.fallback_freq[t]
                assert low <= decoder.fallback_target() < low + freq
                decoder.consume_fallback(low, freq)
