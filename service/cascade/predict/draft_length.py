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
    def length(self, evidence: int, rows: int = 1) -> int:
        """Tokens to draft for a source that agrees with the output's last ``evidence`` bytes, in an
        engine step that verifies ``rows`` requests (the caller also caps it by K and the room left)."""

    def scale(self, rows: int) -> float:
        """How many times the evidence of a lone request a drafted token needs in a step of ``rows``."""


class FixedLength:
    """Always K: a plain static-text proposer (``adaptive: false`` requests and benchmarks)."""

    def __init__(self, k: int) -> None:
        self.k = k

    def length(self, evidence: int, rows: int = 1) -> int:
        return self.k

    def scale(self, rows: int) -> float:
        return 1.0


class ConfidenceLength:
    """About one drafted token per ``bytes_per_token`` bytes of evidence, between ``floor`` and K; in a
    step that verifies ``rows`` requests, each other request raises the bytes a token needs by
    ``crowding`` of them (0.5: eight rows need 4.5×).

    Why crowding: a drafted token costs the step about what another prompt token costs a prefill (on
    vLLM's CPU backend, SmolLM2-135M: ~1 ms against ~25 ms for a one-token step), and every request of
    the step waits for it, while a step of many requests already writes many tokens. So a draft must be
    likelier to be right the more requests share the step: at concurrency 8 through HTTP, 0 / 0.5 / 1 /
    2 gave 1.36 / 1.44 / 1.41 / 1.27× no prediction (benchmarks/RESULTS.md, "Drafts under load"). Held
    anchors keep drafting K (their evidence is the whole stretch they held); fresh anchors and copies
    draft shorter. A lone request (and ``simulate``) is unchanged."""

    CROWDING = 0.5

    def __init__(self, k_max: int, bytes_per_token: float = 1.3, floor: int = 2, crowding: float = CROWDING) -> None:
        self.k_max = k_max
        self.bytes_per_token = max(0.25, bytes_per_token)
        self.floor = max(1, min(floor, k_max))
        self.crowding = max(0.0, crowding)

    def scale(self, rows: int) -> float:
        return 1 + self.crowding * max(0, rows - 1)

    def length(self, evidence: int, rows: int = 1) -> int:
        return max(self.floor, min(self.k_max, int(evidence / (self.bytes_per_token * self.scale(rows)))))
