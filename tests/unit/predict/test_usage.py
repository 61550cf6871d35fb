"""Prediction usage from the proposer's per-step ledger: only what the answer contains counts."""

from __future__ import annotations

from cascade.predict.usage import FinishedLedgers, PredictionLedger, external_id
from hypothesis import given
from hypothesis import strategies as st

steps = st.lists(st.tuples(st.integers(1, 9), st.integers(0, 8), st.integers(0, 8)), max_size=30)


def ledger_of(recorded: list[tuple[int, int, int]]) -> PredictionLedger:
    """A request's ledger: its first step (the prompt's) has no draft."""
    ledger = PredictionLedger()
    ledger.record(1, 0, 0)
    for emitted, drafted, accepted in recorded:
        ledger.record(emitted, drafted, accepted)
    return ledger


def test_a_stop_inside_a_step_keeps_only_the_drafts_before_it() -> None:
    ledger = ledger_of([(9, 8, 8), (5, 8, 4), (9, 8, 8)])
    assert ledger.counts() == (24, 20)
    assert ledger.counts(answer_tokens=12) == (10, 10)  # the third step's first two tokens only
    assert ledger.counts(answer_tokens=1) == (0, 0)


@given(steps, st.integers(0, 300))
def test_accepted_never_exceeds_the_answer_nor_the_drafts(recorded: list[tuple[int, int, int]], answer: int) -> None:
    ledger = ledger_of(recorded)
    answer = min(answer, sum(s.emitted for s in ledger.steps))
    drafted, accepted = ledger.counts(answer)
    assert 0 <= accepted <= drafted
    assert accepted <= max(0, answer - 1)  # a step's last token is the model's own, never a draft
    assert ledger.counts(answer) <= ledger.counts(None)


@given(steps)
def test_counts_grow_with_the_answer(recorded: list[tuple[int, int, int]]) -> None:
    ledger = ledger_of(recorded)
    total = sum(s.emitted for s in ledger.steps)
    previous = (0, 0)
    for answer in range(total + 1):
        now = ledger.counts(answer)
        assert now[0] >= previous[0] and now[1] >= previous[1]
        previous = now
    assert previous == ledger.counts()


def test_finished_ledgers_forget_the_oldest_beyond_capacity() -> None:
    store = FinishedLedgers(capacity=2)
    for name in ("a", "b", "c"):
        store.put(name, PredictionLedger())
    assert len(store) == 2 and store.pop("a") is None and store.pop("c") is not None


def test_external_id_strips_vllms_random_suffix_only() -> None:
    assert external_id("cmpl-1234-abcdef12") == "cmpl-1234"
    assert external_id("plain") == "plain"
    assert external_id("cmpl-ab") == "cmpl-ab"
