"""How many predicted tokens to draft this step, per request, from how the last drafts fared.

vLLM fixes ``num_speculative_tokens`` (K) per engine; a proposer may still draft fewer. Long drafts
pay when the prediction keeps being accepted (one verification step accepts up to K tokens) and
cost a wider verification step when they are rejected. So: double after a draft accepted whole,
keep the length while the output still follows the prediction's text (a different token split is
not a sign of a bad prediction), and start short again after the output left the prediction.
"""

from __future__ import annotations

from typing import Protocol


class DraftLength(Protocol):
    def length(self) -> int:
        """Tokens to draft now (the caller also caps it by K and the room left)."""

    def update(self, proposed: int, accepted: int, on_track: bool) -> None:
        """After the engine verified a draft: ``on_track`` is False when the output left the text."""


class FixedLength:
    """Always K: the behaviour of a plain static-text proposer (benchmarks compare against it)."""

    def __init__(self, k: int) -> None:
        self.k = k

    def length(self) -> int:
        return self.k

    def update(self, proposed: int, accepted: int, on_track: bool) -> None:
        """A fixed length learns nothing."""


class AdaptiveLength:
    """Doubling on success, back to ``start`` after a divergence, never above ``k_max``."""

    def __init__(self, k_max: int, start: int = 8) -> None:
        self.k_max = k_max
        self.start = max(1, min(start, k_max))
        self.current = self.start

    def length(self) -> int:
        return self.current

    def update(self, proposed: int, accepted: int, on_track: bool) -> None:
        if proposed <= 0:
            return
        if not on_track:
            self.current = self.start
        elif accepted >= proposed:
            self.current = min(self.k_max, 2 * self.current)
