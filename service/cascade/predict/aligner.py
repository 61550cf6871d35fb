"""Line alignment: which prediction line should follow the lines the model just wrote?

Lines are the bytes of one line of text, newline included. Each candidate position in the prediction
is scored by the LCS similarity of the recent context lines with the prediction lines before it
(recent lines weigh more). RapidFuzz's LCS is used when installed; ``difflib`` otherwise (same
answers, slower).
"""

from __future__ import annotations

from collections.abc import Sequence
from difflib import SequenceMatcher
from typing import Protocol

Line = bytes

try:
    from rapidfuzz.distance import LCSseq

    def line_similarity(a: Line, b: Line) -> float:
        """Normalised LCS similarity in [0, 1]."""
        if a == b:
            return 1.0
        return float(LCSseq.normalized_similarity(a, b))

    BACKEND = "rapidfuzz"
except ImportError:  # pragma: no cover - exercised only without rapidfuzz

    def line_similarity(a: Line, b: Line) -> float:
        """Normalised similarity in [0, 1] (difflib fallback)."""
        if a == b:
            return 1.0
        return SequenceMatcher(None, a, b, autojunk=False).ratio()

    BACKEND = "difflib"


class Aligner(Protocol):
    def align(self, context_lines: Sequence[Line], prediction_lines: Sequence[Line]) -> int | None:
        """Index of the prediction line that should come next, or None when nothing aligns."""


class LineAligner:
    """Scores every prediction position; the last context line must be similar enough to anchor."""

    def __init__(self, min_last_line_similarity: float = 0.6, decay: float = 0.5) -> None:
        self.min_last = min_last_line_similarity
        self.decay = decay

    def align(self, context_lines: Sequence[Line], prediction_lines: Sequence[Line]) -> int | None:
        if not context_lines or not prediction_lines:
            return None
        last = context_lines[-1]
        best: tuple[float, int] | None = None
        for i, line in enumerate(prediction_lines):
            anchor = line_similarity(last, line)
            if anchor < self.min_last:
                continue
            score, weight = anchor, 1.0
            for d in range(1, min(len(context_lines), i + 1)):
                weight *= self.decay
                score += weight * line_similarity(context_lines[-1 - d], prediction_lines[i - d])
            if best is None or score > best[0]:
                best = (score, i)
        return None if best is None else best[1] + 1


def default_aligner() -> LineAligner:
    return LineAligner()
