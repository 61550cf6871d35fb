"""How many predicted tokens to draft this step, per request, from how the last drafts fared.

vLLM fixes ``num_speculative_tokens`` (K) per engine; a proposer may still draft fewer. Long drafts
pay when the prediction keeps being accepted (one verification step accepts up to K tokens) and
cost a wider verification step when they are rejected. So: start at K (a prediction is usually
right), shrink to about the run the prediction got right when the output leaves it (a renamed
variable on every line leaves short runs), double again after a draft accepted whole, and keep the
length while the output still follows the prediction's text (a different token split is not a
sign of a bad prediction). Replayed on the benchmark's edit cases with a verification step costing
1 + 0.04 × draft tokens (this CPU), this beats every fixed K and start-short-and-double; with
nearly free verification (a GPU) it equals fixed K.
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
    """Starts at K; doubles (up to K) after a draft accepted whole; after a divergence, at most twice
    the run the last draft got right, plus two (never below ``floor``)."""

    def __init__(self, k_max: int, start: int | None = None, floor: int = 4) -> None:
        self.k_max = k_max
        self.floor = max(1, min(floor, k_max))
        self.current = max(1, min(start or k_max, k_max))

    def length(self) -> int:
        return self.current

    def update(self, proposed: int, accepted: int, on_track: bool) -> None:
        if proposed <= 0:
            return
        if not on_track:
            self.current = max(self.floor, min(self.current, 2 * accepted + 2))
        elif accepted >= proposed:
            self.current = min(self.k_max, 2 * self.current)
