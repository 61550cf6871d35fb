"""Pure core of the export: turn the engine's processed top-k log-probabilities into ``topk-renorm``.

The engine hands back, per prompt position, the top-k log-probabilities of the *processed*
distribution (temperature, logit bias, min-p, top-k/top-p already applied; masked tokens are
``-inf``). Consumers such as arithmetic coders need a proper distribution over exactly the ids they
receive, so the kept set (finite entries of the top-k) is renormalised here in float64. The
canonical order (probability descending, id ascending) makes ties unable to reorder the output.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

DISTRIBUTION_TYPE = "topk-renorm"


class LogprobLike(Protocol):
    """What vLLM's ``Logprob`` carries (duck-typed so this module needs no vLLM import)."""

    logprob: float
    rank: int | None


@dataclass(frozen=True)
class ExportPosition:
    """The distribution over the token at ``index`` of the prompt, given every token before it.

    ``ids``/``logprobs`` are the kept candidates, renormalised, in canonical order.
    ``target_logprob`` is the actual token's renormalised log-probability, or ``None`` when the
    processing stack or the top-k cut removed it; ``target_rank`` is its 1-based rank in the
    processed distribution.
    """

    index: int
    target: int
    ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    target_logprob: float | None
    target_rank: int | None


def renormalise(candidates: Iterable[tuple[int, float]], k: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The ``k`` most likely finite candidates, renormalised so their probabilities sum to 1."""
    kept = sorted(((t, lp) for t, lp in candidates if math.isfinite(lp)), key=lambda c: (-c[1], c[0]))[:k]
    if not kept:
        return (), ()
    top = kept[0][1]
    log_total = top + math.log(math.fsum(math.exp(lp - top) for _, lp in kept))
    return tuple(t for t, _ in kept), tuple(lp - log_total for _, lp in kept)


def position_from_logprobs(index: int, target: int, logprobs: Mapping[int, LogprobLike], k: int) -> ExportPosition:
    """One position from vLLM's per-position dict (top-k plus the actual token, which may repeat)."""
    ids, values = renormalise(((t, lp.logprob) for t, lp in logprobs.items()), k)
    target_logprob = None
    for token, value in zip(ids, values, strict=True):
        if token == target:
            target_logprob = value
            break
    entry = logprobs.get(target)
    rank = entry.rank if entry is not None and math.isfinite(entry.logprob) else None
    return ExportPosition(index, target, ids, values, target_logprob, rank)


def positions_from_prompt_logprobs(prompt: Sequence[int], prompt_logprobs: Sequence[Mapping[int, Any] | None],
                                   k: int, first_index: int = 1) -> list[ExportPosition]:
    """Every scored position of a prompt; vLLM leaves position 0 (nothing precedes it) as ``None``."""
    out = []
    for index in range(first_index, len(prompt)):
        scored = prompt_logprobs[index] if index < len(prompt_logprobs) else None
        if scored is None:
            raise ValueError(f"the engine returned no distribution for prompt position {index}")
        out.append(position_from_logprobs(index, prompt[index], scored, k))
    return out
