"""The Responses API's store: bounded in characters, the oldest dropped first."""

from __future__ import annotations

from cascade.api.response_store import ResponseStore, Stored
from hypothesis import given, settings
from hypothesis import strategies as st


def _stored(chars: int) -> Stored:
    return Stored([{"role": "user", "content": "x" * chars}], {})


def test_the_oldest_responses_go_first_once_the_budget_is_full() -> None:
    store = ResponseStore(budget=250)
    for name in "abc":
        store.put(name, _stored(98))  # 98 characters of text and 2 of JSON
    assert store.get("a") is None and store.get("b") is not None and store.get("c") is not None
    assert store.held == 200


def test_a_response_larger_than_the_budget_is_not_kept_and_a_deleted_one_frees_its_share() -> None:
    store = ResponseStore(budget=50)
    store.put("big", _stored(60))
    assert store.get("big") is None and store.held == 0
    store.put("small", _stored(10))
    assert store.delete("small") and not store.delete("small") and store.held == 0


@settings(max_examples=200, deadline=None)
@given(budget=st.integers(0, 500), puts=st.lists(st.tuples(st.sampled_from("abcdef"), st.integers(0, 200)),
                                                max_size=40))
def test_what_is_held_never_exceeds_the_budget_and_is_counted_exactly(budget: int, puts: list[tuple[str, int]]
                                                                      ) -> None:
    store = ResponseStore(budget)
    for name, chars in puts:
        store.put(name, _stored(chars))
        kept = [store.get(n) for n in "abcdef"]
        assert store.held == sum(s.size() for s in kept if s is not None) <= budget
