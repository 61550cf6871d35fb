"""Integer logits → frequency tables: exact sums, every symbol codable, canonical, row independent."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import pytest
import torch
from cascade.codec.exact import frequencies
from cascade.codec.exact.frequencies import frequency_tables, rank_to_token, token_intervals
from hypothesis import given, settings
from hypothesis import strategies as st

T = TypeVar("T")
LOGITS = st.lists(st.integers(-(40 << 16), 40 << 16), min_size=3, max_size=80)


@settings(max_examples=200, deadline=None)
@given(LOGITS, st.integers(1, 79), st.sampled_from([16, 24, 32]))
def test_tables_sum_to_two_to_the_precision_and_every_symbol_is_codable(row: list[int], k: int,
                                                                        precision: int) -> None:
    k = min(k, len(row) - 1)
    ids, cdf = frequency_tables(torch.tensor([row]), k, precision)
    assert int(cdf[0, 0]) == 0 and int(cdf[0, -1]) == 1 << precision
    assert bool((cdf[0, 1:] - cdf[0, :-1] >= 1).all())
    assert sorted(set(ids[0].tolist())) == sorted(ids[0].tolist())


@settings(max_examples=100, deadline=None)
@given(LOGITS, st.integers(1, 40))
def test_canonical_order_is_logit_descending_then_id_ascending(row: list[int], k: int) -> None:
    k = min(k, len(row) - 1)
    ids, _ = frequency_tables(torch.tensor([row]), k, 32)
    expected = sorted(range(len(row)), key=lambda i: (-row[i], i))[:k]
    assert ids[0].tolist() == expected


def test_ties_at_the_top_k_boundary_pick_the_smallest_ids() -> None:
    ids, _ = frequency_tables(torch.tensor([[5, 9, 9, 9, 1, 9]]), 3, 16)
    assert ids[0].tolist() == [1, 2, 3]


@settings(max_examples=50, deadline=None)
@given(st.lists(LOGITS.filter(lambda r: len(r) == 12), min_size=2, max_size=8), st.randoms())
def test_a_row_gets_the_same_table_alone_and_in_any_batch(rows: list[list[int]], rng: object) -> None:
    batch = torch.tensor(rows)
    ids, cdf = frequency_tables(batch, 5, 24)
    for i, row in enumerate(rows):
        one_ids, one_cdf = frequency_tables(torch.tensor([row]), 5, 24)
        assert torch.equal(one_ids[0], ids[i]) and torch.equal(one_cdf[0], cdf[i])


def test_frequencies_follow_the_softmax_closely() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, size=(50, 500))
    ids, cdf = frequency_tables(torch.from_numpy(np.rint(logits * 65536).astype(np.int64)), 64, 32)
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    coded = np.diff(cdf.numpy(), axis=1) / 2**32
    for r in range(50):
        top = probs[r, ids[r].numpy()]
        assert np.allclose(coded[r, :64], top, atol=2e-6, rtol=2e-3)
        assert math.isclose(coded[r, 64], 1 - top.sum(), rel_tol=5e-3, abs_tol=2e-6)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-1000, 1000), min_size=10, max_size=40), st.data())
def test_token_intervals_name_the_symbol_or_the_escape_rank(row: list[int], data: st.DataObject) -> None:
    vocab = len(row)
    k = data.draw(st.integers(1, vocab - 1))
    token = data.draw(st.integers(0, vocab - 1))
    ids, cdf = frequency_tables(torch.tensor([row]), k, 16)
    low, freq, rank = token_intervals(ids, cdf, torch.tensor([token]), vocab)
    top = ids[0].tolist()
    if token in top:
        symbol = top.index(token)
        assert int(rank[0]) == -1
    else:
        symbol = k
        assert rank_to_token(ids[0].numpy(), int(rank[0])) == token
        assert 0 <= int(rank[0]) < vocab - k
    assert (int(low[0]), int(freq[0])) == (int(cdf[0, symbol]), int(cdf[0, symbol + 1] - cdf[0, symbol]))


def test_impossible_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="top_k"):
        frequency_tables(torch.zeros(1, 10, dtype=torch.int64), 10, 16)
    with pytest.raises(ValueError, match="do not fit"):
        frequency_tables(torch.zeros(1, 1 << 17, dtype=torch.int64), 1 << 16, 16)


WIDE = st.lists(st.one_of(st.integers(-(40 << 16), 40 << 16), st.integers(-(1 << 40), 1 << 40),
                          st.sampled_from([0, 7, -(1 << 37), 1 << 37])), min_size=3, max_size=300)


def _compiled_and_torch(table: Callable[..., T], *args: Any) -> tuple[T, T]:
    """``table(*args)`` from the compiled loop, then from the torch path (what a GPU runs)."""
    compiled = table(*args)
    frequencies.COMPILED = False
    try:
        return compiled, table(*args)
    finally:
        frequencies.COMPILED = True


@pytest.mark.skipif(not frequencies.COMPILED, reason="numba is not installed")
@settings(max_examples=200, deadline=None)
@given(st.lists(WIDE, min_size=1, max_size=6), st.integers(1, 299), st.sampled_from([16, 24, 32]))
def test_the_compiled_tables_equal_torchs_integers(rows: list[list[int]], k: int, precision: int) -> None:
    """The compiled loop (histogram selection, then keys ordered bucket by bucket) and torch's topk path give
    the same ids and CDFs — ties, clamped logits, equal rows and k close to the vocabulary included."""
    width = min(len(r) for r in rows)
    logits = torch.tensor([r[:width] for r in rows])
    k = min(k, width - 1, (1 << precision) - 2)
    compiled, expected = _compiled_and_torch(frequency_tables, logits, k, precision)
    assert torch.equal(compiled[0], expected[0]) and torch.equal(compiled[1], expected[1])


@pytest.mark.skipif(not frequencies.COMPILED, reason="numba is not installed")
def test_the_compiled_tables_handle_a_flat_row_and_a_real_vocabulary() -> None:
    flat = torch.zeros(2, 49152, dtype=torch.int64)
    spread = (torch.randn(3, 49152, generator=torch.Generator().manual_seed(2)) * 5 * 65536).to(torch.int64)
    clustered = spread.clone()  # buckets of 1/16 nat holding hundreds of keys beside buckets of a few
    clustered[:, :600] = clustered[:, :600] % 4096 + 40 * 65536
    clustered[:, 600:700] = clustered[:, 600:700] % 4096 + 39 * 65536
    for logits in (flat, spread, clustered):
        compiled, expected = _compiled_and_torch(frequency_tables, logits, 1024, 32)
        assert torch.equal(compiled[0], expected[0]) and torch.equal(compiled[1], expected[1])


@pytest.mark.skipif(not frequencies.COMPILED, reason="numba is not installed")
@settings(max_examples=200, deadline=None)
@given(st.lists(WIDE, min_size=1, max_size=6), st.integers(1, 299))
def test_the_compiled_escape_tables_equal_torchs_integers(rows: list[list[int]], k: int) -> None:
    width = min(len(r) for r in rows)
    logits = torch.tensor([r[:width] for r in rows])
    ids, _ = frequency_tables(logits, min(k, width - 1), 24)
    compiled, expected = _compiled_and_torch(frequencies.escape_tables, logits, ids)
    assert torch.equal(compiled, expected)


@pytest.mark.skipif(not frequencies.COMPILED, reason="numba is not installed")
def test_the_compiled_escape_tables_handle_a_flat_row_and_a_real_vocabulary() -> None:
    flat = torch.zeros(2, 49152, dtype=torch.int64)
    spread = (torch.randn(3, 49152, generator=torch.Generator().manual_seed(3)) * 5 * 65536).to(torch.int64)
    for logits in (flat, spread):
        ids, _ = frequency_tables(logits, 1024, 32)
        compiled, expected = _compiled_and_torch(frequencies.escape_tables, logits, ids)
        assert torch.equal(compiled, expected)


@settings(max_examples=200, deadline=None)
@given(LOGITS, st.data())
def test_escape_tables_sum_to_two_to_the_32_with_one_for_each_top_k_id_and_at_least_one_for_the_rest(
        row: list[int], data: st.DataObject) -> None:
    k = data.draw(st.integers(1, len(row) - 1))
    logits = torch.tensor([row])
    ids, _ = frequency_tables(logits, k, 32)
    cdf = frequencies.escape_tables(logits, ids)[0]
    freq = (cdf[1:] - cdf[:-1]).tolist()
    assert int(cdf[0]) == 0 and int(cdf[-1]) == 1 << frequencies.ESCAPE_BITS
    top = set(ids[0].tolist())
    assert all(f == 1 for i, f in enumerate(freq) if i in top)
    assert all(f >= 1 for i, f in enumerate(freq) if i not in top)


@settings(max_examples=30, deadline=None)
@given(st.lists(LOGITS.filter(lambda r: len(r) == 12), min_size=2, max_size=8))
def test_a_row_gets_the_same_escape_table_alone_and_in_any_batch(rows: list[list[int]]) -> None:
    batch = torch.tensor(rows)
    ids, _ = frequency_tables(batch, 4, 24)
    cdf = frequencies.escape_tables(batch, ids)
    for i, row in enumerate(rows):
        assert torch.equal(frequencies.escape_tables(torch.tensor([row]), ids[i:i + 1])[0], cdf[i])


def test_escape_tables_follow_the_softmax_outside_the_top_k() -> None:
    """The point of container version 4: an escaped token costs what the model says it should, not
    log2(vocab − k) bits."""
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 3, size=(20, 500))
    ids, _ = frequency_tables(torch.from_numpy(np.rint(logits * 65536).astype(np.int64)), 16, 32)
    cdf = frequencies.escape_tables(torch.from_numpy(np.rint(logits * 65536).astype(np.int64)), ids).numpy()
    for r in range(20):
        outside = np.setdiff1d(np.arange(500), ids[r].numpy())
        probs = np.exp(logits[r, outside] - logits[r].max())
        probs /= probs.sum()
        coded = np.diff(cdf[r])[outside] / 2**32
        assert np.allclose(coded, probs, atol=1e-6, rtol=2e-3)


def test_escape_tables_are_the_pinned_integers() -> None:
    """Version 4 containers depend on these integers: any change to the tables is a new format."""
    rng = np.random.default_rng(4)
    logits = torch.from_numpy(rng.integers(-(40 << 16), 40 << 16, size=(6, 3000)))
    ids, _ = frequency_tables(logits, 64, 24)
    cdf = frequencies.escape_tables(logits, ids)
    pinned = "26a02cfa2bce27a934b32c93b7aa2f6c7c5248d342fd7995b51c6319cfeeea63"
    assert hashlib.sha256(cdf.numpy().tobytes()).hexdigest() == pinned
