"""The codec's draft policy (``drafts.SegmentDrafts``): a segment drafts as many rounds of its lanes as
are likely enough to be used for what a drafted position costs, and judges its lanes' guesses even
while it does not draft."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from cascade.codec.exact.drafts import POSITION_COST, SegmentDrafts, worth_drafting
from hypothesis import given
from hypothesis import strategies as st


class _Fixed:
    """Proposes ``guess`` (up to k tokens) after any context not ending in 0."""

    def __init__(self, guess: list[int]) -> None:
        self.guess = guess

    def add(self, key: Hashable, tokens: Sequence[int]) -> None:
        pass

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        return [] if context[-1] == 0 else self.guess[:k]  # a context ending in 0 has nothing to guess


@given(st.integers(1, 200))
def test_a_position_must_be_surer_the_more_rows_a_pass_has(rows: int) -> None:
    assert POSITION_COST <= worth_drafting(rows) < 1.0
    assert worth_drafting(rows + 1) > worth_drafting(rows)
    assert worth_drafting(1) == POSITION_COST


def test_a_lane_whose_guesses_miss_stops_drafting_keeps_guessing_and_drafts_again_once_they_hit() -> None:
    drafts = SegmentDrafts(_Fixed([5, 6, 7, 8]), [0], lanes=1, max_draft=16)
    assert drafts.propose([0], [[1, 2]], [99], room=16) == [[5]]
    drafted: list[int] = []
    for _ in range(8):
        drafts.record(0, [9])  # the decoded token is never the guess
        drafted = drafts.propose([0], [[1, 2]], [99], room=16)[0]
    assert drafted == []
    lengths = []
    for _ in range(40):
        drafts.record(0, [5, 6, 7, 8][:len(drafted) + 1])  # right again: the drafts and the token after them
        drafted = drafts.propose([0], [[1, 2]], [99], room=16)[0]
        lengths.append(len(drafted))
    assert lengths[0] == 0 and lengths[-1] == 4  # the source's whole guess, once it has kept being right
    assert lengths == sorted(lengths)


def test_a_pass_of_many_rows_needs_surer_guesses_than_a_pass_of_one() -> None:
    drafts = SegmentDrafts(_Fixed([5, 6]), [0], lanes=1, max_draft=16)
    drafts.hit_rates[0] = drafts.follow_rates[0] = 0.8
    assert drafts.propose([0], [[1]], [9], room=16, rows=1) == [[5, 6]]
    assert drafts.propose([0], [[1]], [9], room=16, rows=2) == [[5]]
    assert drafts.propose([0], [[1]], [9], room=16, rows=32) == [[]]
    assert drafts.propose([0], [[1]], [9], room=1, rows=1) == [[5]]


def test_a_segment_drafts_whole_rounds_and_none_that_a_lane_cannot_draft() -> None:
    """A round is used only if every lane still decoding in it drafted it: a lane with nothing to
    guess stops every lane's drafts; a lane that ends first does not."""
    drafts = SegmentDrafts(_Fixed([5, 6, 7]), [0], lanes=3, max_draft=16)
    drafts.hit_rates[:] = drafts.follow_rates[:] = [1.0] * 3
    assert drafts.propose([0, 1, 2], [[1], [1], [1]], [9, 9, 9], room=29, rows=3) == [[5, 6, 7]] * 3
    assert drafts.propose([0, 1, 2], [[1], [1], [1]], [9, 9, 2], room=29, rows=3) == [[5, 6, 7]] * 2 + [[5]]
    assert drafts.propose([0, 1, 2], [[1], [1], [1]], [9, 9, 9], room=6, rows=3) == [[5, 6]] * 3
    assert drafts.propose([0, 1, 2], [[1], [1], [0]], [9, 9, 9], room=29, rows=3) == [[]] * 3
    drafts.hit_rates[2] = 0.0  # one lane's guesses miss: no round would be used
    assert drafts.propose([0, 1, 2], [[1], [1], [1]], [9, 9, 9], room=29, rows=3) == [[]] * 3
