"""A segment's tokens as parallel lanes sharing one range-coded stream.

A segment of ``n`` tokens is cut into lanes of ``lane_tokens`` tokens (the last lane shorter);
each lane is conditioned only on the container's prompt, so all lanes of all segments in flight
decode together, one batched model step per position. Their symbols are interleaved in one
stream — position 0 of every lane, then position 1 of every lane still running, … — which is
exactly the order a lock-step batched decoder meets them in. So a segment needs neither per-lane
payload lengths nor per-lane token counts: framing stays a few bytes per segment. Pure: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cascade.codec.range_coder import MAX_OVERRUN, Decoder, Encoder, PayloadOverrunError

MAX_LANES = 64


def lane_lengths(tokens: int, lane_tokens: int) -> list[int]:
    """Token count of each lane: full lanes, then the remainder."""
    if tokens < 0 or lane_tokens < 1:
        raise ValueError("tokens must be ≥ 0 and lane_tokens ≥ 1")
    full, rest = divmod(tokens, lane_tokens)
    return [lane_tokens] * full + ([rest] if rest else [])


def plan_lanes(tokens: int, lane_tokens: int, lanes: int, step_budget: int, extra_lanes: int = 0) -> tuple[int, int]:
    """Lane length and count for an input of ``tokens`` tokens that fits one segment of the default plan
    (``lane_tokens`` × ``lanes``): the plan within ``step_budget`` sequential decode steps (the longest
    lane's tokens) at the smallest cost in bits, as far as the lanes allow.

    Every lane starts from the prompt alone, so shorter lanes, and above all more lanes, cost bits
    (benchmarks/RESULTS.md, "Lane plan": SmolLM2, 4 KB of code, 1,000 + 313 → 768 + 545 +2.0 %,
    → 657 + 656 +3.8 %, → 3 lanes +6.2 %). So the lanes are cut to ``step_budget`` tokens, never
    shorter (1,313 tokens under a budget of 768: 768 + 545), the count is the default plan's, and
    only to meet the budget are up to ``extra_lanes`` lanes added (then the fewest that meet it).
    Never more lanes than ``lanes`` nor longer than ``lane_tokens``. Larger inputs, and a budget of 0,
    keep the default plan (throughput, not latency, is what they need)."""
    if step_budget <= 0 or tokens <= step_budget or tokens > lane_tokens * lanes:
        return lane_tokens, lanes
    default_count = -(-tokens // lane_tokens)
    count = min(lanes, default_count + max(0, extra_lanes), max(default_count, -(-tokens // step_budget)))
    length = min(lane_tokens, max(step_budget, -(-tokens // count)))
    return length, -(-tokens // length)


def split_lanes(tokens: Sequence[int], lane_tokens: int) -> list[list[int]]:
    return [list(tokens[i:i + lane_tokens]) for i in range(0, len(tokens), lane_tokens)]


@dataclass(frozen=True)
class LaneSymbols:
    """One lane's coded symbols, position by position: the table interval and, after an escape, the
    token's interval out of ``fallback_total`` (``fallback_low`` −1: no escape at that position)."""

    low: Sequence[int]
    freq: Sequence[int]
    fallback_low: Sequence[int]
    fallback_freq: Sequence[int]
    fallback_total: int


def encode_lanes(lanes: Sequence[LaneSymbols], precision_bits: int) -> bytes:
    """The interleaved stream of every lane's symbols (position-major, lanes in order)."""
    encoder = Encoder()
    out = bytearray()
    longest = max((len(lane.low) for lane in lanes), default=0)
    for t in range(longest):
        for lane in lanes:
            if t < len(lane.low):
                out += encoder.encode(int(lane.low[t]), int(lane.freq[t]), precision_bits)
                fallback = int(lane.fallback_low[t])
                if fallback >= 0:
                    out += encoder.encode_with_total(fallback, int(lane.fallback_freq[t]), lane.fallback_total)
    out += encoder.finish()
    return bytes(out)


class LaneDecoder:
    """Decodes an interleaved stream in the order ``encode_lanes`` wrote it (the caller steps lanes in order).

    A payload that ends too early raises ``PayloadOverrunError`` (``range_coder.MAX_OVERRUN``) with
    ``tokens``: how many tokens had been decoded when it did.
    """

    def __init__(self, payload: bytes, precision_bits: int, fallback_total: int,
                 max_overrun: int | None = MAX_OVERRUN) -> None:
        self.decoder = Decoder(payload, max_overrun)
        self.precision_bits = precision_bits
        self.fallback_total = fallback_total
        self.tokens = 0

    def target(self) -> int:
        """Where the next table symbol's interval must contain (``0 ≤ target < 2**precision_bits``)."""
        return self.decoder.decode_target(self.precision_bits)

    def consume(self, low: int, freq: int) -> None:
        try:
            self.decoder.consume(low, freq, self.precision_bits)
        except PayloadOverrunError as exc:
            exc.tokens = self.tokens
            raise
        self.tokens += 1

    def fallback_target(self) -> int:
        """After an escape: where the token's fallback interval must contain (``< fallback_total``)."""
        return self.decoder.decode_target_with_total(self.fallback_total)

    def consume_fallback(self, low: int, freq: int) -> None:
        try:
            self.decoder.consume_with_total(low, freq, self.fallback_total)
        except PayloadOverrunError as exc:
            exc.tokens = self.tokens - 1
            raise
