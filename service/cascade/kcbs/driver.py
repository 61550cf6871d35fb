"""Drives ``KcbsSearch`` on a model: every pending beam row becomes one next-token query.

All rows of a step (and of every concurrent search) are submitted at once, so the engine batches
them; the shared prompt is prefilled once and reused through the engine's prefix cache, so a row
costs the prefill of its own suffix only. The model reports raw log-probabilities; the processed
top-k distribution at temperature τ only needs ``raw/τ`` over the top-k, because the full-vocab
normaliser cancels in the per-step renormalisation. The raw values are passed on too: they are
the model's own log-probabilities (``model_logprob`` of a sequence).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, MutableSet, Sequence
from typing import Protocol, TypeVar

from cascade.kcbs.algorithm import BeamRow, StepResult, end_ids

TopLogprobs = Callable[[Sequence[int], int, str], Awaitable[list[tuple[int, float]]]]
"""``(token ids, k, request id) → the k most likely next tokens with raw log-probabilities, best first``."""


class Search(Protocol):
    """What the driver needs of a search (``KcbsSearch``, ``BeamSearch``)."""

    @property
    def done(self) -> bool: ...
    @property
    def step(self) -> int: ...
    @property
    def mask_eos(self) -> bool: ...
    def pending(self) -> list[BeamRow]: ...
    def advance(self, results: Sequence[StepResult]) -> None: ...


S = TypeVar("S", bound=Search)


async def _row_topk(top_logprobs: TopLogprobs, prompt: Sequence[int], row: BeamRow, k: int, mask_eos: bool,
                    eos_ids: frozenset[int], temperature: float, request_id: str) -> StepResult:
    want = k + len(eos_ids) if mask_eos else k
    ids: list[int] = []
    logprobs: list[float] = []
    raw: list[float] = []
    for token_id, logprob in await top_logprobs([*prompt, *row.token_ids], want, request_id):
        if mask_eos and token_id in eos_ids:
            continue
        if math.isfinite(logprob):
            ids.append(token_id)
            logprobs.append(logprob / temperature)
            raw.append(logprob)
        if len(ids) == k:
            break
    return ids, logprobs, raw


async def run_search(top_logprobs: TopLogprobs, prompt: Sequence[int], search: S, k: int,
                     eos_ids: Collection[int] | int | None, temperature: float, request_id: str,
                     live: MutableSet[str]) -> AsyncIterator[S]:
    """Advance ``search`` to the end, yielding it after every step (for streaming the live beam).

    ``live`` holds the search's token while it runs (the app's registry of live searches). If the
    consumer goes away, closing or cancelling this generator cancels the step's row queries, which
    aborts them in the engine.
    """
    ends = end_ids(eos_ids)
    token = f"{request_id}/{id(search)}"
    live.add(token)
    try:
        while not search.done:
            rows = search.pending()
            results = await asyncio.gather(*(
                _row_topk(top_logprobs, prompt, row, k, search.mask_eos, ends, temperature,
                          f"{request_id}-s{search.step}-r{i}") for i, row in enumerate(rows)))
            search.advance(results)
            yield search
    finally:
        live.discard(token)
