"""Code datastore: the most frequent successor of the longest known n-gram, drafts while likely enough."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from cascade.predict.code_datastore import CodeDatastore
from hypothesis import given, settings
from hypothesis import strategies as st


def test_the_most_frequent_successor_is_drafted_with_its_share() -> None:
    store = CodeDatastore.build([[1, 2, 3], [1, 2, 3], [1, 2, 4]], max_n=2)
    token, share = store.successor([9, 1, 2]) or (None, 0.0)
    assert token == 3 and abs(share - 2 / 3) < 1e-6


def test_the_longest_known_context_decides() -> None:
    # after 2 alone 5 is commoner, after (7, 2) it is 6
    store = CodeDatastore.build([[2, 5], [2, 5], [2, 5], [7, 2, 6], [7, 2, 6]], max_n=2)
    assert (store.successor([7, 2]) or (None,))[0] == 6
    assert (store.successor([8, 2]) or (None,))[0] == 5


def test_equally_frequent_successors_give_the_smallest_id() -> None:
    store = CodeDatastore.build([[1, 9], [1, 4], [1, 9], [1, 4]], max_n=1)
    assert store.successor([1]) == (4, 0.5)


def test_ngrams_seen_once_are_left_out() -> None:
    store = CodeDatastore.build([[1, 2, 3, 4]], max_n=3)
    assert store.ngrams == 0
    assert store.propose([1, 2], 4, 0.0) == []


def test_a_draft_stops_where_it_becomes_unlikely() -> None:
    sequences = [[1, 2, 3, 4]] * 4 + [[3, 5]] * 4  # after 3: 4 half of the time
    store = CodeDatastore.build(sequences, max_n=1)
    assert store.propose([1], 8, 0.9) == [2, 3]
    assert store.propose([1], 8, 0.4) == [2, 3, 4]
    assert store.propose([1], 2, 0.0) == [2, 3]


def test_a_saved_datastore_loads_memory_mapped_and_drafts_alike(tmp_path: Path) -> None:
    store = CodeDatastore.build([[1, 2, 3, 1, 2, 3, 1, 2, 5]] * 3, max_n=3)
    store.save(tmp_path / "store")
    loaded = CodeDatastore.load(tmp_path / "store")
    assert loaded.max_n == 3 and loaded.ngrams == store.ngrams
    for context in ([1], [3, 1], [2, 3, 1, 2], [7]):
        assert loaded.propose(context, 6, 0.1) == store.propose(context, 6, 0.1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5), max_size=30), max_size=6), st.lists(st.integers(0, 5), max_size=4))
def test_successors_are_the_counts_of_the_longest_context_seen_twice(sequences: list[list[int]],
                                                                      context: list[int]) -> None:
    max_n = 3
    counts: dict[tuple[int, ...], Counter[int]] = {}
    for sequence in sequences:
        for end in range(1, len(sequence)):
            for n in range(1, min(max_n, end) + 1):
                counts.setdefault(tuple(sequence[end - n:end]), Counter())[sequence[end]] += 1
    expected = None
    for n in range(min(max_n, len(context)), 0, -1):
        seen = counts.get(tuple(context[-n:]))
        if seen and sum(seen.values()) >= 2:
            best = max(seen.values())
            expected = (min(t for t, c in seen.items() if c == best), best / sum(seen.values()))
            break
    found = CodeDatastore.build(sequences, max_n=max_n).successor(context)
    if expected is None:
        assert found is None
    else:
        assert found is not None and found[0] == expected[0] and abs(found[1] - expected[1]) < 1e-6
