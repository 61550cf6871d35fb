"""Token edit distance against a plain DP, and target matching over k-CBS results."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
from cascade.kcbs import (
    EosPolicy,
    FinishReason,
    KcbsResult,
    KcbsSequence,
    match_target,
    run_kcbs,
    token_edit_distance,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from .toy_model import ToyModel

tokens = st.lists(st.integers(min_value=0, max_value=3), max_size=12)


def reference_distance(a: Sequence[int], b: Sequence[int]) -> int:
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) + 1):
        for j in range(len(b) + 1):
            if i == 0 or j == 0:
                table[i][j] = i + j
            else:
                table[i][j] = min(
                    table[i - 1][j] + 1, table[i][j - 1] + 1, table[i - 1][j - 1] + (a[i - 1] != b[j - 1])
                )
    return table[len(a)][len(b)]


@settings(max_examples=300, deadline=None)
@given(a=tokens, b=tokens)
def test_distance_matches_reference_dp(a: list[int], b: list[int]) -> None:
    assert token_edit_distance(a, b) == reference_distance(a, b)


@settings(max_examples=300, deadline=None)
@given(a=tokens, b=tokens, bound=st.integers(min_value=0, max_value=6))
def test_bounded_distance_is_exact_within_the_bound_and_bound_plus_one_beyond(
    a: list[int], b: list[int], bound: int
) -> None:
    assert token_edit_distance(a, b, max_distance=bound) == min(reference_distance(a, b), bound + 1)


def test_negative_bound_raises_value_error() -> None:
    with pytest.raises(ValueError, match="max_distance"):
        token_edit_distance([1], [1], max_distance=-1)


def _result(*sequences: tuple[tuple[int, ...], float, FinishReason]) -> KcbsResult:
    built = tuple(KcbsSequence(ids, math.log(p), p, reason) for ids, p, reason in sequences)
    return KcbsResult(built, math.fsum(s.probability for s in built), steps=3, rows_evaluated=3)


RESULT = _result(((1, 2, 3), 0.4, "length"), ((1, 2, 4), 0.3, "length"), ((5, 6, 7), 0.2, "length"))


def test_exact_target_is_found_and_its_probability_reported() -> None:
    match = match_target(RESULT, [1, 2, 3], max_edit_distance=0)
    assert match.exact
    assert match.matches == [0]
    assert match.near_verbatim_probability == pytest.approx(0.4)


def test_near_verbatim_probability_sums_every_sequence_within_tolerance() -> None:
    match = match_target(RESULT, [1, 2, 9], max_edit_distance=1)
    assert not match.exact
    assert match.matches == [0, 1]
    assert match.near_verbatim_probability == pytest.approx(0.7)


def test_no_match_gives_zero_probability() -> None:
    match = match_target(RESULT, [8, 8, 8], max_edit_distance=1)
    assert match == type(match)(exact=False, near_verbatim_probability=0.0, matches=[])


def test_sequence_ended_by_eos_is_compared_without_it() -> None:
    result = _result(((1, 2, 0), 0.5, "stop"))
    assert match_target(result, [1, 2], max_edit_distance=0).exact


def test_negative_tolerance_raises_value_error() -> None:
    with pytest.raises(ValueError, match="max_edit_distance"):
        match_target(RESULT, [1], max_edit_distance=-1)


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    k=st.integers(min_value=1, max_value=5),
    steps=st.integers(min_value=1, max_value=6),
    policy=st.sampled_from(["block", "stop"]),
    target=st.one_of(st.none(), st.lists(st.integers(min_value=0, max_value=5), max_size=8)),
    pick=st.integers(min_value=0, max_value=99),
    tolerance=st.integers(min_value=0, max_value=3),
)
def test_prefix_sharing_match_agrees_with_matching_each_sequence_alone(
    seed: int, k: int, steps: int, policy: EosPolicy, target: list[int] | None, pick: int, tolerance: int
) -> None:
    model = ToyModel(seed, vocab_size=6)
    result = run_kcbs(
        model.step_fn(k),
        beam_width=k,
        steps=steps,
        final_prune=False,
        eos_token_id=model.eos_token_id,
        eos_policy=policy,
    )
    if target is None:
        target = list(result.sequences[pick % len(result.sequences)].token_ids[:-1])
    match = match_target(result, target, tolerance)
    distances = [
        reference_distance(s.token_ids[:-1] if s.finish_reason == "stop" else s.token_ids, target)
        for s in result.sequences
    ]
    assert match.matches == [i for i, d in enumerate(distances) if d <= tolerance]
    assert match.exact == (0 in distances)
    expected_probability = math.fsum(result.sequences[i].probability for i in match.matches)
    assert match.near_verbatim_probability == expected_probability
