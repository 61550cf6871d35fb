"""Beam search as vLLM's ``use_beam_search`` runs it, as an engine-free state machine.

vLLM's OpenAI server answers ``n > 1`` with ``temperature: 0`` only through this extension, and its
own test suite asks for it that way, so a client written against vLLM expects it. The rule: every
live beam is extended by its ``2 · beam_width`` most likely tokens under the model's own (raw)
log-probabilities; a candidate that is an end-of-sequence token finishes its beam (kept aside,
never extended); the ``beam_width`` best of the others by cumulative log-probability live on. After
``max_tokens`` steps (or once no beam lives) the finished and live beams are ranked by
``cumulative logprob / length ** length_penalty``, the length counting the prompt's tokens and the
generated ones without the end token (Hugging Face's score, which vLLM uses), and the ``beam_width``
best are the answer. Sampling parameters play no part: the search is deterministic.

It shares ``KcbsSearch``'s interface (``pending``/``advance``/``done``), so the same async driver
batches its rows; unlike k-CBS nothing is renormalised, and the scores are not probabilities of
any sampling scheme.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from cascade.kcbs.algorithm import MAX_BEAM_WIDTH, BeamRow, StepResult, end_ids


@dataclass(frozen=True, slots=True)
class Beam:
    """One beam: generated tokens (without a final end token), the sum of their log-probabilities,
    and each step's top log-probabilities (``(token id, logprob)``, best first) where its tokens were
    chosen. ``end_token`` is the end-of-sequence id that finished it (``None``: cut by length)."""

    token_ids: tuple[int, ...]
    logprob: float
    steps: tuple[tuple[tuple[int, float], ...], ...]
    end_token: int | None = None

    @property
    def finish_reason(self) -> str:
        return "stop" if self.end_token is not None else "length"


class BeamSearch:
    """``beam_width`` beams for ``max_tokens`` steps after a prompt of ``prompt_tokens`` tokens (its
    length is part of the final score). Ties rank the earlier-expanded beam and the likelier token
    first, so a search is reproducible."""

    mask_eos = False

    def __init__(self, beam_width: int, max_tokens: int, prompt_tokens: int,
                 eos_token_id: int | Collection[int] | None, *, ignore_eos: bool = False,
                 length_penalty: float = 1.0) -> None:
        if not 1 <= beam_width <= MAX_BEAM_WIDTH:
            raise ValueError(f"beam_width must be in [1, {MAX_BEAM_WIDTH}], got {beam_width}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if not math.isfinite(length_penalty):
            raise ValueError(f"length_penalty must be finite, got {length_penalty}")
        self.beam_width = beam_width
        self._max_tokens = max_tokens
        self._prompt_tokens = prompt_tokens
        self._ends = frozenset() if ignore_eos else end_ids(eos_token_id)
        self._length_penalty = length_penalty
        self._live: list[Beam] = [Beam((), 0.0, ())]
        self._finished: list[Beam] = []
        self._step = 0

    @property
    def candidates_per_row(self) -> int:
        """How many of each row's most likely tokens a step needs."""
        return 2 * self.beam_width

    @property
    def step(self) -> int:
        return self._step

    @property
    def done(self) -> bool:
        return self._step >= self._max_tokens or not self._live

    def pending(self) -> list[BeamRow]:
        """The live beams, in the order ``advance`` expects their rows' results."""
        return [] if self.done else [BeamRow(beam.token_ids, beam.logprob) for beam in self._live]

    def advance(self, results: Sequence[StepResult]) -> None:
        """Extend every live beam by its row's top tokens (ids and raw log-probabilities, in any order)."""
        if self.done:
            raise RuntimeError("advance() called on a finished beam search")
        if len(results) != len(self._live):
            raise ValueError(f"expected results for {len(self._live)} rows, got {len(results)}")
        pool: list[tuple[float, int, int, Beam]] = []
        for order, (beam, result) in enumerate(zip(self._live, results, strict=True)):
            ids, logprobs = result[0], result[1]
            if len(ids) != len(logprobs):
                raise ValueError(f"{len(ids)} token ids but {len(logprobs)} logprobs for one row")
            top = tuple(sorted(((int(token), float(lp)) for token, lp in zip(ids, logprobs, strict=True)
                                if not math.isnan(lp) and lp != -math.inf), key=lambda entry: -entry[1]))
            for rank, (token, lp) in enumerate(top[:self.candidates_per_row]):
                if lp == math.inf:
                    raise ValueError(f"invalid logprob {lp} for token {token}")
                if token in self._ends:
                    self._finished.append(Beam(beam.token_ids, beam.logprob + lp, (*beam.steps, top), token))
                else:
                    extended = Beam((*beam.token_ids, token), beam.logprob + lp, (*beam.steps, top))
                    pool.append((-extended.logprob, order, rank, extended))
        self._step += 1
        self._live = [entry[3] for entry in heapq.nsmallest(self.beam_width, pool, key=lambda e: e[:3])]

    def score(self, beam: Beam) -> float:
        """vLLM's (Hugging Face's) ranking: the log-probability over the length to the power of the penalty."""
        length = max(self._prompt_tokens + len(beam.token_ids), 1)
        return beam.logprob / length ** self._length_penalty

    def result(self) -> list[Beam]:
        """The ``beam_width`` best of the finished and the live beams, best first."""
        if not self.done:
            raise RuntimeError(f"beam search not finished: step {self._step} of {self._max_tokens}")
        every = [*self._finished, *self._live]
        order = sorted(range(len(every)), key=lambda i: (-self.score(every[i]), i))
        return [every[i] for i in order[:self.beam_width]]
