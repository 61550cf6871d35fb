"""Drives ``KcbsSearch`` on a vLLM engine: every pending beam row becomes a one-token request.

All rows of a step (and of every concurrent search) are submitted at once, so the engine batches
them; the shared prompt is prefilled once and reused through vLLM's prefix cache, so a row costs
the prefill of its own suffix only. The engine reports raw log-probabilities; the processed
top-k distribution at temperature τ only needs ``raw/τ`` over the top-k, because the full-vocab
normaliser cancels in the per-step renormalisation. The raw values are passed on too: they are
the model's own log-probabilities (``model_logprob`` of a sequence).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from cascade.kcbs.algorithm import BeamRow, KcbsSearch, StepResult

if TYPE_CHECKING:
    from cascade.engine.manager import EngineManager


async def _row_topk(engines: EngineManager, prompt: Sequence[int], row: BeamRow, k: int, mask_eos: bool,
                    eos_id: int | None, temperature: float, request_id: str) -> StepResult:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    want = k + 1 if mask_eos and eos_id is not None else k
    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=want, output_kind=RequestOutputKind.FINAL_ONLY)
    final = None
    async for output in engines.generate([*prompt, *row.token_ids], params, request_id):
        final = output
    if final is None or not final.outputs or not final.outputs[0].logprobs:
        raise RuntimeError("engine returned no logprobs for a k-CBS row")
    ranked = sorted(final.outputs[0].logprobs[0].items(), key=lambda kv: (-kv[1].logprob, kv[0]))
    ids: list[int] = []
    logprobs: list[float] = []
    raw: list[float] = []
    for token_id, lp in ranked:
        if mask_eos and token_id == eos_id:
            continue
        if math.isfinite(lp.logprob):
            ids.append(token_id)
            logprobs.append(lp.logprob / temperature)
            raw.append(lp.logprob)
        if len(ids) == k:
            break
    return ids, logprobs, raw


_LIVE_SEARCHES: set[str] = set()


def live_searches() -> int:
    """k-CBS searches running in this process (the leak checks and ``/metrics`` read it)."""
    return len(_LIVE_SEARCHES)


async def run_search(engines: EngineManager, prompt: Sequence[int], search: KcbsSearch, k: int,
                     eos_id: int | None, temperature: float, request_id: str) -> AsyncIterator[KcbsSearch]:
    """Advance ``search`` to the end, yielding it after every step (for streaming the live beam).

    If the consumer goes away (client disconnect), closing or cancelling this generator cancels the
    step's row requests, which aborts them in the engine.
    """
    token = f"{request_id}/{id(search)}"
    _LIVE_SEARCHES.add(token)
    try:
        while not search.done:
            rows = search.pending()
            results = await asyncio.gather(*(
                _row_topk(engines, prompt, row, k, search.mask_eos, eos_id, temperature,
                          f"{request_id}-s{search.step}-r{i}") for i, row in enumerate(rows)))
            search.advance(results)
            yield search
    finally:
        _LIVE_SEARCHES.discard(token)
