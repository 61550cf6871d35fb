"""The Responses API's store: bounded in bytes of memory, the oldest dropped first."""

from __future__ import annotations

import sys

from cascade.api.response_store import ResponseStore, Stored
from hypothesis import given, settings
from hypothesis import strategies as st


def _stored(text: str) -> Stored:
    return Stored([{"role": "user", "content": text}], {})


def test_the_oldest_responses_go_first_once_the_budget_is_full() -> None:
    one = _stored("x" * 100).size()
    store = ResponseStore(budget=int(2.5 * one))
    for name in "abc":
        store.put(name, _stored("x" * 100))
    assert store.get("a") is None and store.get("b") is not None and store.get("c") is not None
    assert store.held == 2 * one


def test_a_character_counts_as_the_bytes_it_takes_in_memory() -> None:
    emoji, ascii_ = _stored("😀" * 1000).size(), _stored("x" * 1000).size()
    assert emoji >= sys.getsizeof("😀" * 1000) > 3 * ascii_ - 3 * sys.getsizeof("")


def test_a_response_larger_than_the_budget_is_not_kept_and_a_deleted_one_frees_its_share() -> None:
    store = ResponseStore(budget=200)
    store.put("big", _stored("x" * 300))
    assert store.get("big") is None and store.held == 0
    store.put("small", _stored("x"))
    assert store.delete("small") and not store.delete("small") and store.held == 0


@settings(max_examples=200, deadline=None)
@given(budget=st.integers(0, 2000), puts=st.lists(st.tuples(st.sampled_from("abcdef"), st.text(max_size=200)),
                                                 max_size=40))
def test_what_is_held_never_exceeds_the_budget_and_is_counted_exactly(budget: int, puts: list[tuple[str, str]]
                                                                      ) -> None:
    store = ResponseStore(budget)
    for name, text in puts:
        store.put(name, _stored(text))
        kept = [store.get(n) for n in "abcdef"]
        assert store.held == sum(s.size() for s in kept if s is not None) <= budget
