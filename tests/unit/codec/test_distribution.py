"""Top-k log-probabilities → integer frequencies: exact sums, no empty intervals, canonical and frozen."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
from cascade.codec.distribution import (
    Q_BITS,
    Q_FLOOR,
    WEIGHT_BITS,
    build_distribution,
    ideal_bits,
    quantise,
    weights,
)
from hypothesis import given, settings
from hypothesis import strategies as st

PRECISIONS = st.sampled_from([16, 24, 32])
ODD_FLOATS = st.one_of(st.floats(-80, 0, width=32), st.floats(width=32),
                       st.sampled_from([0.0, -0.0, 1e-7, -1e-30, -np.inf, np.nan, np.inf]))


@st.composite
def top_k(draw: st.DrawFn, max_vocab: int = 3000, max_k: int = 300) -> tuple[list[int], list[float], int]:
    vocab = draw(st.integers(1, max_vocab))
    k = draw(st.integers(1, min(vocab, max_k)))
    ids = draw(st.lists(st.integers(0, vocab - 1), min_size=k, max_size=k, unique=True))
    logprobs = draw(st.lists(ODD_FLOATS, min_size=k, max_size=k))
    return ids, logprobs, vocab


@settings(max_examples=80, deadline=None)
@given(top_k(), PRECISIONS)
def test_frequencies_sum_exactly_to_two_to_the_precision(case: tuple[list[int], list[float], int],
                                                         precision: int) -> None:
    ids, logprobs, vocab = case
    dist = build_distribution(ids, logprobs, vocab, precision)
    assert dist.cdf[0] == 0 and int(dist.cdf[-1]) == 1 << precision
    assert dist.cdf.size == len(ids) + (dist.escape_index is not None) + 1


@settings(max_examples=80, deadline=None)
@given(top_k(), PRECISIONS)
def test_every_codable_symbol_gets_nonzero_frequency(case: tuple[list[int], list[float], int],
                                                     precision: int) -> None:
    ids, logprobs, vocab = case
    dist = build_distribution(ids, logprobs, vocab, precision)
    assert (dist.frequencies >= 1).all()
    for token in {*ids, 0, vocab - 1}:
        assert dist.interval(dist.symbol_for_token(token))[1] >= 1


@settings(max_examples=50, deadline=None)
@given(st.data(), PRECISIONS)
def test_canonical_order_is_invariant_under_input_permutation(data: st.DataObject, precision: int) -> None:
    ids, logprobs, vocab = data.draw(top_k(max_k=60))
    if data.draw(st.booleans()):
        logprobs = [float(np.float32(round(lp, 0))) if math.isfinite(lp) else lp for lp in logprobs]
    order = data.draw(st.permutations(list(range(len(ids)))))
    a = build_distribution(ids, logprobs, vocab, precision)
    b = build_distribution([ids[i] for i in order], [logprobs[i] for i in order], vocab, precision)
    assert np.array_equal(a.token_ids, b.token_ids) and np.array_equal(a.cdf, b.cdf)


def test_canonical_order_is_logprob_descending_then_token_id_ascending() -> None:
    dist = build_distribution([9, 3, 7, 1, 5], [-2.0, -1.0, -2.0, -3.0, -1.0], 20, 16)
    assert dist.token_ids.tolist() == [3, 5, 7, 9, 1]
    assert dist.escape_index == 5


def test_escape_is_present_exactly_when_top_k_is_smaller_than_the_vocabulary() -> None:
    assert build_distribution([0, 1], [-0.1, -2.5], 3, 16).escape_index == 2
    assert build_distribution([0, 1, 2], [-0.1, -2.5, -3.0], 3, 16).escape_index is None


def test_escape_carries_the_mass_the_top_k_leaves() -> None:
    dist = build_distribution([4, 8], [math.log(0.5), math.log(0.25)], 100, 32)
    probs = dist.frequencies / dist.total
    assert probs == pytest.approx([0.5, 0.25, 0.25], abs=2**-Q_BITS)


def test_escape_keeps_one_unit_when_the_top_k_already_holds_all_the_mass() -> None:
    dist = build_distribution([0, 1], [0.0, -0.01], 1000, 16)
    assert dist.escape_index is not None
    assert dist.interval(dist.escape_index)[1] == 1


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-12, 3, width=32), min_size=2, max_size=200), PRECISIONS)
def test_frequencies_follow_the_model_probabilities(logits: list[float], precision: int) -> None:
    x = np.array(logits, dtype=np.float64)
    logprobs = x - x.max() - math.log(float(np.exp(x - x.max()).sum()))
    dist = build_distribution(list(range(len(x))), logprobs.astype(np.float32), len(x), precision)
    probs = dist.frequencies / dist.total
    slack = (len(x) + 2) / dist.total + 1e-4
    assert np.all(np.abs(probs - np.exp(logprobs[dist.token_ids])) <= slack)


def test_quantisation_rounds_clamps_and_maps_non_finite_values() -> None:
    q = quantise([0.0, 1e-3, -1.0, -1.5 / (1 << Q_BITS), -1e9, -np.inf, np.nan, np.inf])
    assert q.tolist() == [0, 0, -(1 << Q_BITS), -2, Q_FLOOR, Q_FLOOR, Q_FLOOR, 0]


def test_weights_are_two_to_the_31_times_exp_within_two_units() -> None:
    q = np.arange(Q_FLOOR, 1, 997, dtype=np.int64)
    exact = np.array([(1 << WEIGHT_BITS) * math.exp(v / (1 << Q_BITS)) for v in q.tolist()])
    assert np.all(np.abs(weights(q) - exact) <= 2)
    assert weights(np.array([0]))[0] == 1 << WEIGHT_BITS


def test_table_depends_only_on_the_float32_values_not_their_container() -> None:
    values = np.array([-0.1, -1.7, -2.3, -9.0], dtype=np.float32)
    ids = [5, 1, 9, 2]
    reference = build_distribution(ids, values, 50, 24)
    for same in (values.tolist(), values.astype(np.float64)):
        assert np.array_equal(build_distribution(ids, same, 50, 24).cdf, reference.cdf)
    narrow_ids = np.array(ids, dtype=np.int32)
    assert np.array_equal(build_distribution(narrow_ids, values, 50, 24).cdf, reference.cdf)


@pytest.mark.parametrize(("precision", "digest"), [
    (16, "5399d32f2022da5d1e5120427c484c92"),
    (24, "9c5787a9b21ba6c9dbbb76dbae6f8729"),
    (32, "ffb9eaf015a734f7f72f4164b0a1300b"),
])
def test_tables_are_frozen_across_machines_and_releases(precision: int, digest: str) -> None:
    """A changed digest means existing containers no longer decode: bump the container version."""
    ids = [(i * 37) % 512 for i in range(64)]
    logprobs = [-1.2 - 0.41 * i + 0.003 * (i % 7) for i in range(64)]
    dist = build_distribution(ids, logprobs, 512, precision)
    data = dist.token_ids.astype("<i8").tobytes() + dist.cdf.astype("<i8").tobytes()
    assert hashlib.sha256(data).hexdigest()[:32] == digest


def test_k_equal_to_a_50k_vocabulary_fits_precision_16() -> None:
    vocab = 50_000
    rng = np.random.default_rng(1)
    logprobs = -rng.exponential(8.0, vocab).astype(np.float32)
    dist = build_distribution(np.arange(vocab), logprobs, vocab, 16)
    assert dist.escape_index is None and (dist.frequencies >= 1).all() and int(dist.cdf[-1]) == 1 << 16


def test_more_symbols_than_the_precision_can_hold_is_a_value_error() -> None:
    build_distribution(np.arange((1 << 16) - 1), np.full((1 << 16) - 1, -20.0), 1 << 17, 16)
    with pytest.raises(ValueError, match="do not fit"):
        build_distribution(np.arange(1 << 16), np.full(1 << 16, -20.0), 1 << 17, 16)


@pytest.mark.parametrize(("ids", "logprobs", "vocab", "precision"), [
    ([1, 1], [-1.0, -2.0], 10, 16),
    ([10], [-1.0], 10, 16),
    ([-1], [-1.0], 10, 16),
    ([1, 2], [-1.0], 10, 16),
    ([], [], 10, 16),
    ([1], [-1.0], 10, 12),
    ([0.5], [-1.0], 10, 16),
    ([1], [[-1.0]], 10, 16),
])
def test_malformed_inputs_are_value_errors(ids: list[int], logprobs: list[float], vocab: int,
                                           precision: int) -> None:
    with pytest.raises(ValueError):
        build_distribution(ids, logprobs, vocab, precision)


@settings(max_examples=30, deadline=None)
@given(top_k(max_k=50), PRECISIONS, st.data())
def test_symbol_at_finds_the_symbol_whose_interval_holds_the_target(
        case: tuple[list[int], list[float], int], precision: int, data: st.DataObject) -> None:
    dist = build_distribution(*case, precision)
    target = data.draw(st.integers(0, dist.total - 1))
    low, freq = dist.interval(dist.symbol_at(target))
    assert low <= target < low + freq


def test_ideal_bits_is_minus_log2_of_the_probability() -> None:
    assert ideal_bits(math.log(0.25)) == pytest.approx(2.0)
