"""Earlier responses draft for later requests of the same scope, within a token budget."""

from __future__ import annotations

from cascade.predict.response_cache import MIN_RESPONSE_TOKENS, ResponseCache
from cascade.predict.simulator import simulate
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.predict.toy_tokens import ToyTokenizer

ANSWER = ("def binary_search(items, target):\n    low, high = 0, len(items) - 1\n    while low <= high:\n"
          "        mid = (low + high) // 2\n        if items[mid] == target:\n            return mid\n"
          "        if items[mid] < target:\n            low = mid + 1\n        else:\n            high = mid - 1\n"
          "    return -1\n")
PREDICTION = "def linear_search(items, target):\n    for i, item in enumerate(items):\n        pass\n"


def test_a_repeated_answer_drafts_from_the_earlier_response() -> None:
    tok = ToyTokenizer()
    target, prediction = tok.encode_text(ANSWER), tok.encode_text(PREDICTION)
    cache = ResponseCache(1000)
    lone = simulate(target, prediction, tok, k=16, responses=cache.source(""))
    cache.add("", target)
    again = simulate(target, prediction, tok, k=16, responses=cache.source(""))
    assert again.tokens == lone.tokens == target
    assert again.state is not None and again.state.accepted_by_source["responses"] > len(target) // 2
    assert again.steps * 2 < lone.steps


def test_responses_of_another_scope_are_not_drafted() -> None:
    tok = ToyTokenizer()
    cache = ResponseCache(1000)
    cache.add("tenant-a", tok.encode_text(ANSWER))
    assert cache.source("tenant-b") is None
    assert cache.source("tenant-a") is not None


def test_responses_too_short_or_larger_than_the_budget_are_not_kept() -> None:
    cache = ResponseCache(50)
    cache.add("", list(range(MIN_RESPONSE_TOKENS - 1)))
    cache.add("", list(range(51)))
    assert len(cache) == 0 and cache.tokens == 0


def test_a_zero_budget_keeps_nothing() -> None:
    cache = ResponseCache(0)
    cache.add("", list(range(100)))
    assert cache.source("") is None


@settings(max_examples=60, deadline=None)
@given(responses=st.lists(st.tuples(st.sampled_from(["", "a", "b"]),
                                    st.lists(st.integers(0, 6), min_size=0, max_size=40)), max_size=30),
       budget=st.integers(0, 120))
def test_the_cache_stays_within_its_budget_and_drafts_only_what_a_kept_response_continued(
        responses: list[tuple[str, list[int]]], budget: int) -> None:
    cache = ResponseCache(budget)
    for scope, tokens in responses:
        cache.add(scope, tokens)
        assert cache.tokens <= budget
    kept: dict[str, list[list[int]]] = {}
    for scope, tokens in responses:
        kept.setdefault(scope, []).append(tokens)
    for scope, answers in kept.items():
        source = cache.source(scope)
        if source is None:
            continue
        context = answers[-1][:len(answers[-1]) // 2]
        draft = source.propose(context, 8)
        if draft:
            found = source.match(context)
            assert found is not None
            n = found.length
            assert any(any(a[i:i + n] == context[-n:] and a[i + n:i + n + len(draft)] == draft
                           for i in range(len(a))) for a in answers)
