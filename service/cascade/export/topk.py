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

import numpy as np

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


class FlatLike(Protocol):
    """What vLLM's ``FlatLogprobs`` carries: every position's entries in flat lists."""

    start_indices: list[int]
    end_indices: list[int]
    token_ids: list[int]
    logprobs: list[float]
    ranks: list[int | None]


def positions_from_flat(prompt: Sequence[int], flat: FlatLike, k: int,
                        first_index: int = 1) -> list[ExportPosition] | None:
    """``positions_from_prompt_logprobs`` for vLLM's flat layout, vectorised over positions.

    Each position holds the actual token's entry and then the engine's top-k (``k + 1`` entries,
    the token repeated when it is in the top-k); like the per-position path, the candidates are
    those ``k + 1`` without the repeat. Returns ``None`` when the layout is not that one, so the
    caller falls back to the per-position path.
    """
    count = len(prompt) - first_index
    starts = np.asarray(flat.start_indices[first_index:len(prompt)], dtype=np.int64)
    ends = np.asarray(flat.end_indices[first_index:len(prompt)], dtype=np.int64)
    if count <= 0 or len(starts) != count or np.any(ends - starts != k + 1) or np.any(starts[1:] != ends[:-1]):
        return None
    lo, hi = int(starts[0]), int(ends[-1])
    ids = np.asarray(flat.token_ids[lo:hi], dtype=np.int64).reshape(count, k + 1)
    values = np.asarray(flat.logprobs[lo:hi], dtype=np.float64).reshape(count, k + 1)
    targets = np.asarray(prompt[first_index:], dtype=np.int64)
    if np.any(ids[:, 0] != targets):
        return None
    target_rank = flat.ranks[lo:hi:k + 1]
    cand = values.copy()
    cand[(ids[:, 1:] == ids[:, :1]).any(axis=1), 0] = -np.inf
    order = np.lexsort((ids, -cand), axis=-1)[:, :k]
    cand_ids, cand = np.take_along_axis(ids, order, -1), np.take_along_axis(cand, order, -1)
    finite = np.isfinite(cand)
    kept = finite.sum(axis=1)
    top = np.where(kept > 0, cand[:, 0], 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        mass = np.where(finite, np.exp(cand - top[:, None]), 0.0).sum(axis=1)
        renormed = cand - (top + np.log(np.where(kept > 0, mass, 1.0)))[:, None]
    is_target = (cand_ids == targets[:, None]) & finite
    has_target = is_target.any(axis=1)
    target_values = np.where(has_target, renormed[np.arange(count), is_target.argmax(axis=1)], 0.0)
    target_finite = np.isfinite(values[:, 0])
    id_rows, value_rows = cand_ids.tolist(), renormed.tolist()
    out = []
    for row in range(count):
        n = int(kept[row])
        out.append(ExportPosition(first_index + row, int(targets[row]), tuple(id_rows[row][:n]),
                                  tuple(value_rows[row][:n]),
                                  float(target_values[row]) if has_target[row] else None,
                                  target_rank[row] if target_finite[row] else None))
    return out


def positions_from_prompt_logprobs(prompt: Sequence[int], prompt_logprobs: Sequence[Mapping[int, Any] | None],
                                   k: int, first_index: int = 1) -> list[ExportPosition]:
    """Every scored position of a prompt; vLLM leaves position 0 (nothing precedes it) as ``None``."""
    if hasattr(prompt_logprobs, "start_indices"):
        fast = positions_from_flat(prompt, prompt_logprobs, k, first_index)  # type: ignore[arg-type]
        if fast is not None:
            return fast
    out = []
    for index in range(first_index, len(prompt)):
        scored = prompt_logprobs[index] if index < len(prompt_logprobs) else None
        if scored is None:
            raise ValueError(f"the engine returned no distribution for prompt position {index}")
        out.append(position_from_logprobs(index, prompt[index], scored, k))
    return out
