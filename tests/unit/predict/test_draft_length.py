"""Draft length from evidence: a fresh anchor drafts a little, an anchor that keeps holding drafts K."""

from __future__ import annotations

from cascade.predict.draft_length import ConfidenceLength, FixedLength


def test_length_grows_with_evidence_up_to_k() -> None:
    lengths = ConfidenceLength(64, bytes_per_token=2, floor=2)
    assert [lengths.length(e) for e in (0, 4, 10, 60, 128, 10_000)] == [2, 2, 5, 30, 64, 64]


def test_fixed_length_ignores_evidence() -> None:
    assert FixedLength(8).length(0) == 8 == FixedLength(8).length(1000)


def test_floor_never_exceeds_k() -> None:
    assert ConfidenceLength(1, floor=4).length(0) == 1
