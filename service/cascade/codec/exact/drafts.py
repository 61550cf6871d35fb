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

CONTEXT_TOKENS = 32
PROMPT_KEY = "prompt"
POSITION_COST = 0.5
"""A drafted position's cost in one-row steps, about (``bench_exact_pass_cost.py``: 0.45–0.53 on an AVX2
Zen 3, 0.17–0.28 on an AVX-512 host): the higher, so that drafts pay on either."""
HIT_MEMORY = 0.125
"""Weight of the newest guess in a lane's running rates."""
HIT_START, FOLLOW_START = 0.6, 0.7
"""A lane's rates before its first guess: a lone lane drafts one token, and more as its guesses prove right."""


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
    """One decode segment's draft source (its context and every lane's decoded tokens) and its drafts,
    chosen from its lanes' running rates: how often a lane's guess for its next token is right, and how
    often a guessed token after a right one is right too — judged every step against the tokens decoded,
    drafted or not (a guess not drafted costs a lookup, no pass). The segment drafts as many rounds as
    the chance that a round is used is worth its positions in a pass of its rows (``worth_drafting``;
    ``propose``), and only guesses when the first round is not.

    Why: a drafted position costs about as much as another row of the pass (compute, not the weights'
    stream), so guesses must be right at least that often to pay, and more often the more rows a pass
    already has; and a round is used only if all its lanes' guesses are right. Lanes that drafted on
    their own, doubling after each whole accept, slowed decoding down (held-out 16 KB of code, SmolLM2,
    Zen 3: decode 0.82× without drafts, steps 768 → 752). Replayed with the decoder's walk on 12 held-out
    pieces each of code, prose and JSON records of 1, 4 and 16 KB: at Zen 3's pass costs 0.54–0.98×
    plain decoding before, 0.995–1.04× now; at an AVX-512 host's 0.62–1.27× before, 1.00–1.23× now
    (``bench_codec_latency.py --replay 12``; benchmarks/RESULTS.md, "Drafted passes on an AVX2 host")."""

    def __init__(self, source: DraftSource, prompt: Sequence[int], lanes: int, max_draft: int) -> None:
        self.source = source
        self.prompt = list(prompt)
        self.max_draft = max_draft
        self.hit_rates = [HIT_START] * lanes
        self.follow_rates = [FOLLOW_START] * lanes
        self.guesses: list[list[int]] = [[] for _ in range(lanes)]
        source.add(PROMPT_KEY, self.prompt[1:])  # the separator is no text

    def propose(self, lanes: Sequence[int], decoded: Sequence[Sequence[int]], left: Sequence[int], room: int,
                rows: int = 1) -> list[list[int]]:
        """Drafts for a step of the segment's running ``lanes`` (their ``decoded`` tokens, tokens ``left``
        to decode), at most ``room`` tokens in all, in a pass of ``rows`` rows; each may be empty.

        The decoder walks the lanes' streams in turn, a token of each lane per round, and stops at the
        first lane whose next distribution was not computed: a drafted round is used only if every lane
        still decoding then drafted it and all were right. So the segment drafts whole rounds, as many as
        the chance that a round is used (the product of its lanes' chances) is worth a position per lane."""
        k = min(self.max_draft, room // max(1, len(lanes)))
        guesses = [self._guess(lane, done, min(k, n - 1)) for lane, done, n in zip(lanes, decoded, left, strict=True)]
        worth, chance, rounds = worth_drafting(rows), 1.0, 0
        while rounds < k:
            for lane, guess, n in zip(lanes, guesses, left, strict=True):
                if n > rounds + 1:  # this lane decodes in round rounds + 1
                    right = (self.follow_rates if rounds else self.hit_rates)[lane] if len(guess) > rounds else 0.0
                    chance *= right
            if chance < worth:
                break
            rounds += 1
        return [guess[:rounds] for guess in guesses]

    def _guess(self, lane: int, decoded: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens guessed to follow ``decoded`` in ``lane``, kept to be judged by ``record``."""
        guess: list[int] = []
        if k > 0:
            tail = list(decoded[-CONTEXT_TOKENS:])
            if len(tail) < CONTEXT_TOKENS:
                tail = self.prompt[len(self.prompt) - (CONTEXT_TOKENS - len(tail)):] + tail
            guess = [int(t) for t in self.source.propose(tail, k)[:k]]
        self.guesses[lane] = guess
        return guess

    def record(self, lane: int, tokens: Sequence[int]) -> None:
        """``tokens`` were decoded in ``lane`` this step (its accepted drafts and the token after them)."""
        self.source.add(lane, tokens)
        guess, self.guesses[lane] = self.guesses[lane], []
        for j, (guessed, token) in enumerate(zip(guess, tokens, strict=False)):  # as far as both go
            right = guessed == int(token)
            rates = self.follow_rates if j else self.hit_rates
            rates[lane] += HIT_MEMORY * (right - rates[lane])
            if not right:
                break


def worth_drafting(rows: int) -> float:
    """The chance of being used at which a drafted round pays in a pass of ``rows`` rows (of one segment):
    the round costs ``POSITION_COST`` of a one-row step per row, and a used round saves a step, which
    costs ``1 + POSITION_COST·(rows − 1)``."""
    return POSITION_COST * rows / (1 + POSITION_COST * (rows - 1))


DraftSourceFactory = Callable[[], DraftSource]
