"""TokenNgramSource: longest, then most recent, n-gram match with a continuation, against brute force."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import pytest
from cascade.predict.token_source import TokenNgramSource
from hypothesis import given, settings
from hypothesis import strategies as st


class BruteForceSource:
    """The specification, written plainly: every occurrence of every suffix, continuation times recorded."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.sequences: dict[Hashable, list[int]] = {}
        self.times: dict[Hashable, list[int]] = {}
        self.clock = 0

    def add(self, key: Hashable, tokens: Sequence[int]) -> None:
        for token in tokens:
            self.sequences.setdefault(key, []).append(token)
            self.times.setdefault(key, []).append(self.clock)
            self.clock += 1

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        if k <= 0:
            return []
        for n in range(min(self.max_n, len(context)), self.min_n - 1, -1):
            suffix = list(context[-n:])
            best: tuple[int, list[int]] | None = None
            for key, tokens in self.sequences.items():
                for start in range(len(tokens) - n):  # a continuation token must follow
                    if tokens[start:start + n] == suffix:
                        time = self.times[key][start + n]
                        if best is None or time > best[0]:
                            best = (time, tokens[start + n:start + n + k])
            if best is not None:
                return best[1]
        return []


def test_drafts_the_continuation_of_the_longest_match() -> None:
    source = TokenNgramSource(min_n=2, max_n=4)
    source.add("a", [1, 2, 3, 4, 5, 6])
    source.add("b", [9, 2, 3, 7, 8])
    # [2, 3] occurs in both (b is more recent) but [1, 2, 3] only in a: longest wins
    assert source.propose([1, 2, 3], 2) == [4, 5]
    assert source.propose([0, 2, 3], 3) == [7, 8]


def test_prefers_the_most_recent_occurrence_among_equally_long_matches() -> None:
    source = TokenNgramSource(min_n=2, max_n=3)
    source.add("a", [5, 6, 1, 5, 6, 2])
    assert source.propose([5, 6], 1) == [2]
    source.add("b", [5, 6, 3])
    assert source.propose([5, 6], 1) == [3]


def test_a_match_at_the_end_of_a_sequence_is_skipped_so_a_lane_can_query_its_own_output() -> None:
    source = TokenNgramSource(min_n=2, max_n=8)
    output = [10, 11, 12, 13, 10, 11]
    source.add("self", output)
    # the suffix [10, 11] ends the sequence itself, so the earlier occurrence continues it
    assert source.propose(output, 4) == [12, 13, 10, 11]


def test_no_match_shorter_than_min_n_and_no_draft_for_k_zero() -> None:
    source = TokenNgramSource(min_n=3, max_n=5)
    source.add(0, [1, 2, 3, 4])
    assert source.propose([2, 3], 4) == []
    assert source.propose([1, 2, 3], 0) == []
    assert source.propose([1, 2, 3], 5) == [4]
    assert source.propose([], 5) == []


def test_appending_in_pieces_equals_appending_at_once() -> None:
    """Small appends are indexed token by token, long ones with numpy: the index is the same."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 6, 400).tolist()
    whole, pieces = TokenNgramSource(), TokenNgramSource()
    whole.add("x", tokens[:5])
    whole.add("x", tokens[5:])
    for i in range(0, len(tokens), 3):
        pieces.add("x", tokens[i:i + 3])
    for cut in range(len(tokens)):
        assert whole.propose(tokens[:cut], 5) == pieces.propose(tokens[:cut], 5)
    assert whole.propose(tokens, 8) == pieces.propose(tokens, 8)


def test_numpy_integer_tokens_give_plain_int_drafts() -> None:
    source = TokenNgramSource()
    source.add("a", list(np.array([7, 8, 9, 10 + 2**40], dtype=np.int64)))
    draft = source.propose(list(np.array([7, 8], dtype=np.int64)), 2)
    assert draft == [9, 10 + 2**40] and all(type(t) is int for t in draft)


def test_rejects_an_empty_length_range() -> None:
    with pytest.raises(ValueError):
        TokenNgramSource(min_n=3, max_n=2)


@settings(max_examples=200, deadline=None)
@given(adds=st.lists(st.tuples(st.integers(0, 2), st.lists(st.integers(0, 3), max_size=12)), max_size=6),
       context=st.lists(st.integers(0, 3), max_size=10), k=st.integers(0, 6),
       lengths=st.tuples(st.integers(1, 3), st.integers(0, 4)))
def test_matches_the_brute_force_reference(adds: list[tuple[int, list[int]]], context: list[int], k: int,
                                           lengths: tuple[int, int]) -> None:
    min_n, extra = lengths
    fast, slow = TokenNgramSource(min_n, min_n + extra), BruteForceSource(min_n, min_n + extra)
    for key, tokens in adds:
        fast.add(key, tokens)
        slow.add(key, tokens)
        assert fast.propose(context, k) == slow.propose(context, k)
        own = fast.tokens(key)
        assert fast.propose(own, k) == slow.propose(own, k)


@settings(max_examples=60, deadline=None)
@given(head=st.lists(st.integers(0, 3), max_size=20), long=st.lists(st.integers(0, 3), min_size=32, max_size=70),
       context=st.lists(st.integers(0, 3), max_size=10), k=st.integers(1, 6), min_n=st.integers(1, 3))
def test_long_appends_match_the_brute_force_reference(head: list[int], long: list[int], context: list[int], k: int,
                                                      min_n: int) -> None:
    fast, slow = TokenNgramSource(min_n, min_n + 3), BruteForceSource(min_n, min_n + 3)
    for key, tokens in ((1, head), (2, head), (1, long)):
        fast.add(key, tokens)
        slow.add(key, tokens)
    assert fast.propose(context, k) == slow.propose(context, k)
    assert fast.propose(long, k) == slow.propose(long, k)


def test_an_output_copy_that_runs_into_its_own_end_repeats_the_loop() -> None:
    source = TokenNgramSource(2, 4)
    output = [7, 1, 2, 1, 2, 1, 2]
    source.add("output", output)
    found = source.match(output)
    assert found is not None
    assert source.continuation(found, 6) == [1, 2]  # the recorded continuation stops at the end
    assert source.continuation(found, 6, looping=True) == [1, 2, 1, 2, 1, 2]


@given(st.lists(st.integers(0, 3), min_size=2, max_size=40), st.integers(1, 20))
@settings(max_examples=200, deadline=None)
def test_a_looping_continuation_is_what_copying_token_by_token_would_draft(output: list[int], k: int) -> None:
    """A ``looping`` draft is always ``k`` long and reads the output on from the match: each drafted
    token is the one a period (output length − match position) before it, drafted tokens included."""
    source = TokenNgramSource(1, 1)
    source.add("output", output)
    found = source.match(output)
    if found is None:
        return
    draft = source.continuation(found, k, looping=True)
    assert len(draft) == k
    period = len(output) - found.position
    extended = list(output)
    for token in draft:
        assert token == extended[len(extended) - period]
        extended.append(token)
