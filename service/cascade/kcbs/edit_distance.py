"""Token-level edit distance and target matching for near-verbatim extraction bounds.

Near-verbatim extraction asks which returned beams lie within a small edit distance of a target
continuation; the sum of their probabilities is the near-verbatim lower bound. Up to k² beams are checked
per request, so the distance is computed in a diagonal band and abandoned once it must exceed the bound.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from cascade.kcbs.algorithm import KcbsResult, KcbsSequence


def _checked_bound(value: int, name: str) -> int:
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def _next_row(prev: list[int], i: int, token: Hashable, b: Sequence[Hashable], bound: int) -> list[int]:
    """Row i of the Levenshtein table from row i − 1, only within |i − j| ≤ bound, capped at bound + 1."""
    cap = bound + 1
    cur = [cap] * (len(b) + 1)
    cur[0] = min(i, cap)
    for j in range(max(1, i - bound), min(len(b), i + bound) + 1):
        cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (token != b[j - 1]), cap)
    return cur


def token_edit_distance(a: Sequence[Hashable], b: Sequence[Hashable], max_distance: int | None = None) -> int:
    """Levenshtein distance (unit insertions, deletions, substitutions) between two token sequences.

    With `max_distance` only cells with |i − j| ≤ max_distance are computed (any path leaving that band
    already costs more) and the search stops once a whole row exceeds the bound, since row minima never
    decrease. Any distance above the bound is reported as `max_distance + 1`, which keeps the cost at
    O(len · max_distance).
    """
    bound = max(len(a), len(b)) if max_distance is None else _checked_bound(max_distance, "max_distance")
    if abs(len(a) - len(b)) > bound:
        return bound + 1
    row = [min(j, bound + 1) for j in range(len(b) + 1)]
    for i, token in enumerate(a, start=1):
        row = _next_row(row, i, token, b, bound)
        if min(row) > bound:
            return bound + 1
    return row[-1]


@dataclass(frozen=True, slots=True)
class TargetMatch:
    """Which returned sequences are near-verbatim copies of the target (indices into `sequences`).

    `near_verbatim_probability` is the lower bound on the probability that top-k sampling reproduces the
    target within the tolerance; `exact` says whether the target itself is among the returned sequences.
    """

    exact: bool
    near_verbatim_probability: float
    matches: list[int]


def _comparable_ids(sequence: KcbsSequence) -> tuple[int, ...]:
    if sequence.finish_reason == "stop":
        return sequence.token_ids[:-1]
    return sequence.token_ids


def match_target(result: KcbsResult, target_ids: Sequence[int], max_edit_distance: int,
                 same_text: Sequence[bool] | None = None) -> TargetMatch:
    """Compare every returned sequence with the target continuation.

    A sequence that ended with EOS is compared without its EOS token, since EOS is no part of the text.
    ``same_text[i]`` marks sequences whose text equals a text target: they are exact matches whatever
    their tokenisation (the model may write a blank line as two newline tokens where the tokenizer
    uses one).
    Beams share long prefixes, so sequences are visited in lexicographic order and the table rows of the
    common prefix are reused: about (steps·k + k²) rows instead of k²·steps.
    """
    bound = _checked_bound(max_edit_distance, "max_edit_distance")
    target = tuple(target_ids)
    candidates = [_comparable_ids(s) for s in result.sequences]
    rows = [[min(j, bound + 1) for j in range(len(target) + 1)]]
    computed: tuple[int, ...] = ()
    distances = [bound + 1] * len(candidates)
    for index in sorted(range(len(candidates)), key=candidates.__getitem__):
        ids = candidates[index]
        shared = 0
        while shared < min(len(computed), len(ids)) and computed[shared] == ids[shared]:
            shared += 1
        del rows[shared + 1 :]
        while len(rows) <= len(ids) and min(rows[-1]) <= bound:
            rows.append(_next_row(rows[-1], len(rows), ids[len(rows) - 1], target, bound))
        computed = ids[: len(rows) - 1]
        if len(rows) == len(ids) + 1:
            distances[index] = rows[-1][-1]
    if same_text is not None:
        distances = [0 if same else d for d, same in zip(distances, same_text, strict=True)]
    matches = [i for i, d in enumerate(distances) if d <= bound]
    return TargetMatch(
        exact=any(distances[i] == 0 for i in matches),
        near_verbatim_probability=math.fsum(result.sequences[i].probability for i in matches),
        matches=matches,
    )
