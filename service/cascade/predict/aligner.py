"""Line alignment: which prediction line should follow the lines the model just wrote?

Lines are the bytes of one line of text, newline included. Each candidate position in the prediction
is scored by the LCS similarity of the recent context lines with the prediction lines before it
(recent lines weigh more), computed by RapidFuzz (a pinned dependency).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from rapidfuzz.distance import LCSseq

Line = bytes


def line_similarity(a: Line, b: Line) -> float:
    """Normalised LCS similarity in [0, 1]."""
    if a == b:
        return 1.0
    return float(LCSseq.normalized_similarity(a, b))


class Aligner(Protocol):
    def align(self, context_lines: Sequence[Line], prediction_lines: Sequence[Line], near: int = -1,
              fits: Callable[[int], bool] | None = None) -> int | None:
        """Index of the prediction line that should come next, or None when nothing aligns. ``near``:
        the prediction line the output left the prediction in; ``fits``: which next lines may follow
        (the output's partial line must be their prefix)."""


class LineAligner:
    """Scores every prediction position; the last context line must be similar enough to anchor.

    Of the fitting positions that score within ``tie`` of the best, the first one after ``near`` wins
    (else the last one before it): repeated lines (the same statement in several functions, a
    repetitive output) then resume the prediction after the line the output left it in, as a diff
    would, instead of jumping back to the first copy and running into the same edit again.
    """

    def __init__(self, min_last_line_similarity: float = 0.6, decay: float = 0.5, tie: float = 0.2) -> None:
        self.min_last = min_last_line_similarity
        self.decay = decay
        self.tie = tie

    def scores(self, context_lines: Sequence[Line], prediction_lines: Sequence[Line]) -> dict[int, float]:
        """Score of each prediction line that may hold the last context line."""
        last = context_lines[-1]
        found: dict[int, float] = {}
        for i, line in enumerate(prediction_lines):
            anchor = line_similarity(last, line)
            if anchor < self.min_last:
                continue
            score, weight = anchor, 1.0
            for d in range(1, min(len(context_lines), i + 1)):
                weight *= self.decay
                score += weight * line_similarity(context_lines[-1 - d], prediction_lines[i - d])
            found[i] = score
        return found

    def align(self, context_lines: Sequence[Line], prediction_lines: Sequence[Line], near: int = -1,
              fits: Callable[[int], bool] | None = None) -> int | None:
        if not context_lines or not prediction_lines:
            return None
        scores = {i + 1: score for i, score in self.scores(context_lines, prediction_lines).items()
                  if i + 1 < len(prediction_lines) and (fits is None or fits(i + 1))}
        if not scores:
            return None
        best = max(scores.values())
        close = [i for i, score in scores.items() if score >= best - self.tie]
        after = [i for i in close if i > near]
        return min(after) if after else max(close)


def default_aligner() -> LineAligner:
    return LineAligner()
