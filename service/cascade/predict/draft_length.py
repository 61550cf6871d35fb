"""How many tokens to draft this step, from how much evidence the drafting source has.

vLLM fixes ``num_speculative_tokens`` (K) per engine; a proposer may still draft fewer. Long drafts
pay when they are right (one verification step accepts up to K tokens) and cost a wider
verification step when they are not. The evidence for a source is how many bytes of the output it
already agrees with: the bytes that anchored it (the output's recent bytes found in the prediction,
or the n-gram the prompt or output continues) plus every byte written since while it held. So a
fresh anchor on a few bytes drafts a few tokens, and the draft grows as the anchor keeps holding,
instead of starting from a fixed length after every divergence.
"""

from __future__ import annotations

from typing import Protocol


class DraftLength(Protocol):
    def length(self, evidence: int) -> int:
        """Tokens to draft for a source that agrees with the output's last ``evidence`` bytes (the
        caller also caps it by K and the room left)."""


class FixedLength:
    """Always K: a plain static-text proposer (``adaptive: false`` requests and benchmarks)."""

    def __init__(self, k: int) -> None:
        self.k = k

    def length(self, evidence: int) -> int:
        return self.k


class ConfidenceLength:
    """About one drafted token per ``bytes_per_token`` bytes of evidence, between ``floor`` and K."""

    def __init__(self, k_max: int, bytes_per_token: float = 1.3, floor: int = 2) -> None:
        self.k_max = k_max
        self.bytes_per_token = max(0.25, bytes_per_token)
        self.floor = max(1, min(floor, k_max))

    def length(self, evidence: int) -> int:
        return max(self.floor, min(self.k_max, int(evidence / self.bytes_per_token)))
