"""Top-k-constrained beam search (k-CBS) as an engine-free state machine.

The search never calls a model: `pending()` names the rows that need a next-token distribution and
`advance()` takes each row's top-k log-probabilities. That lets an async driver batch the rows of many
concurrent searches into one engine step, and lets tests drive the exact same code with fixed logits.

Every score is a log-probability under top-k sampling with k = `beam_width`, the caller's temperature,
and (with the "block" policy) EOS suppressed: each step's top-k of the processed distribution,
renormalised. That is *not* a bound for ordinary (untruncated) sampling, where a sequence can be far less
likely; so each sequence also carries `model_logprob`, the model's own log-probability of its tokens
(full vocabulary, temperature 1, no renormalisation), when the driver supplies the raw values.

EOS policy: "block" masks EOS at every step 1..T, the last included, so every returned sequence has
exactly T tokens and none ends with EOS. "stop" leaves EOS in the top-k; a beam that takes it ends there
(finish_reason "stop") and is never extended.

The sequences a search returns are prefix-free: live sequences all have the same length and contain no
EOS, and a sequence that emitted EOS is never extended. So `captured_probability` is exactly the
probability that top-k sampling produces one of them (a deterministic lower bound on any event they
cover), and since prefix-free sequences are disjoint events it is at most 1. Rounding (each score
carries an O(steps·ε) error) can push the sum a few ulps above 1; it is clamped to 1.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Literal

EosPolicy = Literal["block", "stop"]
FinishReason = Literal["stop", "length"]

MAX_BEAM_WIDTH = 64

StepResult = tuple[Sequence[int], Sequence[float]] | tuple[Sequence[int], Sequence[float], Sequence[float]]
"""Per row: top-k token ids, their processed log-probabilities, and optionally the model's own (raw)
log-probabilities of the same tokens (for `model_logprob`)."""


@dataclass(frozen=True, slots=True)
class BeamRow:
    """A running beam that needs its next-token distribution.

    `token_ids` is the generated suffix only, so the driver owns the prompt and can share its prefix cache.
    """

    token_ids: tuple[int, ...]
    score: float


@dataclass(frozen=True, slots=True)
class KcbsSequence:
    """One beam. `finish_reason` is None while the beam can still be extended (only in `live_beams()`)."""

    token_ids: tuple[int, ...]
    score: float
    probability: float
    finish_reason: FinishReason | None
    model_logprob: float | None = None


@dataclass(frozen=True, slots=True)
class KcbsResult:
    """Sequences best first; `rows_evaluated` counts next-token distributions, the cost of the search."""

    sequences: tuple[KcbsSequence, ...]
    captured_probability: float
    steps: int
    rows_evaluated: int


StepFn = Callable[[list[BeamRow], bool], Sequence[StepResult]]


@dataclass(frozen=True, slots=True)
class _Entry:
    token_ids: tuple[int, ...]
    score: float
    finished: bool
    model_logprob: float | None = 0.0


def _rank(entry: _Entry) -> tuple[float, tuple[int, ...]]:
    return (-entry.score, entry.token_ids)


def _logsumexp(values: Sequence[float]) -> float:
    peak = max(values)
    return peak + math.log(math.fsum(math.exp(v - peak) for v in values))


def end_ids(eos: int | Collection[int] | None) -> frozenset[int]:
    """The end-of-sequence ids as a set: a model may end on several (a chat model's end of turn
    besides the document's EOS), and k-CBS blocks or stops on every one."""
    if eos is None:
        return frozenset()
    return frozenset({eos} if isinstance(eos, int) else eos)


class KcbsSearch:
    """k-CBS for one request, advanced one step at a time by whoever owns the model.

    Per step every live row is expanded by its top-k tokens with score `parent + logprob − Z`, Z being the
    logsumexp of that row's top-k log-probabilities. The pool of candidates (plus beams that already
    emitted EOS under the "stop" policy) is pruned to the `beam_width` best, except at the last step when
    `final_prune` is False: then all of them (≤ k²) are kept, which gives a tighter lower bound. Ties go
    to the higher score, then to the lexicographically smaller token tuple, so results are reproducible.
    """

    def __init__(
        self,
        beam_width: int,
        steps: int,
        final_prune: bool,
        eos_token_id: int | Collection[int] | None = None,
        eos_policy: EosPolicy = "block",
    ) -> None:
        if isinstance(beam_width, bool) or not isinstance(beam_width, int):
            raise ValueError(f"beam_width must be an integer, got {beam_width!r}")
        if not 1 <= beam_width <= MAX_BEAM_WIDTH:
            raise ValueError(f"beam_width must be in [1, {MAX_BEAM_WIDTH}], got {beam_width}")
        if isinstance(steps, bool) or not isinstance(steps, int):
            raise ValueError(f"steps must be an integer, got {steps!r}")
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        if eos_policy not in ("block", "stop"):
            raise ValueError(f"eos_policy must be 'block' or 'stop', got {eos_policy!r}")
        self._beam_width = beam_width
        self._steps = steps
        self._final_prune = bool(final_prune)
        self._eos_ids = end_ids(eos_token_id)
        self._eos_policy: EosPolicy = eos_policy
        self._step = 0
        self._rows_evaluated = 0
        self._beam: list[_Entry] = [_Entry((), 0.0, False)]

    @property
    def step(self) -> int:
        """Steps completed so far (0 before the first `advance`)."""
        return self._step

    @property
    def done(self) -> bool:
        """True after the last step, or earlier once every beam has emitted EOS (nothing left to expand)."""
        return self._step >= self._steps or all(e.finished for e in self._beam)

    @property
    def mask_eos(self) -> bool:
        """Whether the driver must mask EOS in this step's distribution before taking the top-k."""
        return self._eos_policy == "block" and bool(self._eos_ids) and not self.done

    def pending(self) -> list[BeamRow]:
        """The rows to evaluate this step, in the order `advance` expects their results."""
        if self.done:
            return []
        return [BeamRow(e.token_ids, e.score) for e in self._beam if not e.finished]

    def advance(self, results: Sequence[StepResult]) -> None:
        """Apply one step given, per pending row, its top-k token ids and processed log-probabilities.

        Entries may be unsorted and fewer than k; entries at -inf (masked tokens padding a short top-k)
        are ignored. Anything else that breaks the contract raises ValueError, because a silently wrong
        distribution would make the reported bound wrong.
        """
        if self.done:
            raise RuntimeError("advance() called on a finished k-CBS search")
        rows = [e for e in self._beam if not e.finished]
        if len(results) != len(rows):
            raise ValueError(f"expected results for {len(rows)} pending rows, got {len(results)}")
        pool = [e for e in self._beam if e.finished]
        for row, result in zip(rows, results, strict=True):
            pool.extend(self._expand(row, *result))
        self._step += 1
        self._rows_evaluated += len(rows)
        if self._step == self._steps and not self._final_prune:
            self._beam = sorted(pool, key=_rank)
        else:
            self._beam = heapq.nsmallest(self._beam_width, pool, key=_rank)

    def _expand(self, row: _Entry, token_ids: Sequence[int], logprobs: Sequence[float],
                model_logprobs: Sequence[float] | None = None) -> list[_Entry]:
        if len(token_ids) != len(logprobs) or (model_logprobs is not None and len(model_logprobs) != len(logprobs)):
            raise ValueError(f"{len(token_ids)} token ids but {len(logprobs)} logprobs for one row")
        raw = dict(zip(token_ids, model_logprobs, strict=True)) if model_logprobs is not None else {}
        if len(token_ids) > self._beam_width:
            raise ValueError(f"{len(token_ids)} tokens for one row, more than beam_width={self._beam_width}")
        if len(set(token_ids)) != len(token_ids):
            raise ValueError(f"duplicate token ids in one row's top-k: {list(token_ids)}")
        kept: list[tuple[int, float]] = []
        for token, logprob in zip(token_ids, logprobs, strict=True):
            lp = float(logprob)
            if math.isnan(lp) or lp == math.inf:
                raise ValueError(f"invalid logprob {lp} for token {token}")
            if lp != -math.inf:
                kept.append((int(token), lp))
        if not kept:
            raise ValueError("a row's top-k has no token with finite logprob")
        if self.mask_eos and any(token in self._eos_ids for token, _ in kept):
            raise ValueError(f"an EOS token {sorted(self._eos_ids)} has finite logprob although it must be masked")
        log_mass = _logsumexp([lp for _, lp in kept])
        stop_on_eos = self._eos_policy == "stop"
        return [
            _Entry(
                (*row.token_ids, token),
                row.score + (lp - log_mass),
                stop_on_eos and token in self._eos_ids,
                row.model_logprob + float(raw[token]) if row.model_logprob is not None and token in raw else None,
            )
            for token, lp in kept
        ]

    def _sequences(self) -> tuple[KcbsSequence, ...]:
        finished = self.done
        return tuple(
            KcbsSequence(
                e.token_ids,
                e.score,
                math.exp(e.score),
                "stop" if e.finished else ("length" if finished else None),
                e.model_logprob if e.token_ids else None,
            )
            for e in self._beam
        )

    def live_beams(self) -> list[KcbsSequence]:
        """The current beam, best first, for streaming progress; running beams have finish_reason None."""
        return list(self._sequences())

    def result(self) -> KcbsResult:
        """The final sequences best first and their captured probability (see module docstring)."""
        if not self.done:
            raise RuntimeError(f"k-CBS search not finished: step {self._step} of {self._steps}")
        sequences = self._sequences()
        return KcbsResult(
            sequences=sequences,
            captured_probability=min(1.0, math.fsum(s.probability for s in sequences)),
            steps=self._step,
            rows_evaluated=self._rows_evaluated,
        )


def run_kcbs(
    step_fn: StepFn,
    *,
    beam_width: int,
    steps: int,
    final_prune: bool,
    eos_token_id: int | Collection[int] | None = None,
    eos_policy: EosPolicy = "block",
) -> KcbsResult:
    """Run a whole search synchronously; `step_fn(rows, mask_eos)` returns one (ids, logprobs) per row."""
    search = KcbsSearch(beam_width, steps, final_prune, eos_token_id, eos_policy)
    while not search.done:
        search.advance(step_fn(search.pending(), search.mask_eos))
    return search.result()
