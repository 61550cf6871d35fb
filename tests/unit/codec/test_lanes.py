"""Lanes: one interleaved range-coded stream that a lock-step batched decoder reads back exactly."""

from __future__ import annotations

import random

import pytest
from cascade.codec.lanes import (
    LaneDecoder,
    LaneSymbols,
    encode_lanes,
    lane_lengths,
    plan_lanes,
    split_lanes,
)
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


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 40_000), st.integers(16, 1000), st.integers(1, 64), st.integers(0, 2000), st.integers(0, 3))
def test_the_lane_plan_takes_the_fewest_lanes_within_the_step_budget_and_never_exceeds_the_default(
        tokens: int, lane_tokens: int, lanes: int, budget: int, extra: int) -> None:
    planned_tokens, planned_lanes = plan_lanes(tokens, lane_tokens, lanes, budget, extra)
    if budget == 0 or tokens <= budget or tokens > lane_tokens * lanes:
        assert (planned_tokens, planned_lanes) == (lane_tokens, lanes)
        return
    default_count = len(lane_lengths(tokens, lane_tokens))
    assert len(lane_lengths(tokens, planned_tokens)) == planned_lanes
    assert min(budget, lane_tokens) <= planned_tokens <= lane_tokens  # never shorter than the budget needs
    assert default_count <= planned_lanes <= min(lanes, default_count + extra)
    if planned_tokens > budget:  # over the budget only when a shorter lane would need a lane too many
        assert -(-tokens // (planned_tokens - 1)) > min(lanes, default_count + extra)


def test_the_lane_plan_of_a_4_kb_file_shortens_its_first_lane_to_the_budget_or_adds_a_lane_when_allowed() -> None:
    assert plan_lanes(1313, 1000, 16, 768) == (768, 2)
    assert lane_lengths(1313, 768) == [768, 545]
    assert plan_lanes(1313, 1000, 16, 512) == (657, 2)  # the budget is out of reach without a third lane
    assert plan_lanes(1326, 1000, 16, 512, extra_lanes=1) == (512, 3)
    assert plan_lanes(5300, 1000, 16, 512, extra_lanes=1) == (758, 7)  # one lane more than 1000 × 5 + 300
    assert plan_lanes(345, 1000, 16, 768) == (1000, 16)  # within the budget as one lane: unchanged
