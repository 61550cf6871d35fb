"""Draft length from evidence: a fresh anchor drafts a little, an anchor that keeps holding drafts K."""

from __future__ import annotations

from cascade.predict.draft_length import ConfidenceLength, FixedLength
from hypothesis import given
from hypothesis import strategies as st


def test_length_grows_with_evidence_up_to_k() -> None:
    lengths = ConfidenceLength(64, bytes_per_token=2, floor=2)
    assert [lengths.length(e) for e in (0, 4, 10, 60, 128, 10_000)] == [2, 2, 5, 30, 64, 64]


def test_fixed_length_ignores_evidence() -> None:
    assert FixedLength(8).length(0) == 8 == FixedLength(8).length(1000)


def test_floor_never_exceeds_k() -> None:
    assert ConfidenceLength(1, floor=4).length(0) == 1


def test_a_crowded_step_needs_more_evidence_per_token() -> None:
    """Each other request verified in the step raises the bytes a drafted token needs by ``crowding``."""
    lengths = ConfidenceLength(64, bytes_per_token=1, floor=2, crowding=0.5)
    assert lengths.length(40) == lengths.length(40, rows=1) == 40
    assert lengths.length(40, rows=3) == 20
    assert lengths.length(40, rows=8) == 8
    assert lengths.length(10_000, rows=8) == 64  # an anchor that held long still drafts K
    assert lengths.length(0, rows=8) == 2


@given(st.integers(0, 5_000), st.integers(1, 64))
def test_more_rows_never_draft_longer(evidence: int, rows: int) -> None:
    lengths = ConfidenceLength(64)
    assert lengths.length(evidence, rows + 1) <= lengths.length(evidence, rows) <= lengths.length(evidence)
