"""Drafts for speculative exact decoding: what a decode segment's lanes guess their next tokens from.

A lane's next tokens are guessed from what is already known to the decoder — the container's
context, the lane's own decoded tokens and those of the segment's other lanes — by the project's
one drafting core (``cascade.predict.token_source.TokenNgramSource``: the longest recent n-gram match
with a continuation). A guess is only ever *verified*: the runner decodes every token from the
exact distribution the container was coded with, so a wrong draft costs work, never a wrong token.
Pure: no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Protocol

from cascade.predict.token_source import TokenNgramSource

INITIAL_DRAFT = 4
CONTEXT_TOKENS = 32
PROMPT_KEY = "prompt"


class DraftSource(Protocol):
    """What the runner needs of a drafter (``TokenNgramSource`` is one)."""

    def add(self, key: Hashable, tokens: Sequence[int]) -> None: ...

    def propose(self, context: Sequence[int], k: int) -> list[int]: ...


def ngram_source() -> DraftSource:
    """Matches of two tokens up. A drafted position costs ~0.3 of a one-row step since the step got
    cheaper (``bench_exact_pass_cost.py``, 384 cached positions: 1×2 1.28× a 1×1 pass), and a
    single-token match is right too rarely to pay for it: SmolLM2, replayed on 12 held-out pieces each of
    code and prose, 1 KB and 4 KB, priced by those pass costs (``bench_codec_latency.py --replay 12``),
    1.05–1.10× plain decoding against 0.99–1.07× with one-token matches (benchmarks/RESULTS.md, "Codec
    drafts from two-token matches")."""
    return TokenNgramSource(min_n=2, max_n=16)


class SegmentDrafts:
    """One decode segment's draft source (its context and every lane's decoded tokens) and each lane's
    draft length, which adapts to the lane's acceptance: doubled (up to ``max_draft``) when a whole
    draft was accepted, halved (down to 1) when the draft missed."""

    def __init__(self, source: DraftSource, prompt: Sequence[int], lanes: int, max_draft: int) -> None:
        self.source = source
        self.prompt = list(prompt)
        self.max_draft = max_draft
        self.lengths = [min(INITIAL_DRAFT, max_draft)] * lanes
        source.add(PROMPT_KEY, self.prompt[1:])  # the separator is no text

    def propose(self, lane: int, decoded: Sequence[int], room: int) -> list[int]:
        """At most ``room`` tokens guessed to follow ``decoded`` in ``lane`` (may be none)."""
        k = min(self.lengths[lane], room)
        if k <= 0:
            return []
        tail = list(decoded[-CONTEXT_TOKENS:])
        if len(tail) < CONTEXT_TOKENS:
            tail = self.prompt[len(self.prompt) - (CONTEXT_TOKENS - len(tail)):] + tail
        return [int(t) for t in self.source.propose(tail, k)[:k]]

    def record(self, lane: int, drafted: int, accepted: int, tokens: Sequence[int]) -> None:
        """``tokens`` were decoded in ``lane`` this step, ``accepted`` of its ``drafted`` draft tokens among them."""
        self.source.add(lane, tokens)
        if drafted:
            if accepted == drafted:
                self.lengths[lane] = min(self.max_draft, 2 * self.lengths[lane])
            else:
                self.lengths[lane] = max(1, self.lengths[lane] // 2)


DraftSourceFactory = Callable[[], DraftSource]
