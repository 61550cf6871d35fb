"""The KcbsSearch state machine: its stepping contract, input validation and tie-breaking."""

from __future__ import annotations

import math

import pytest
from cascade.kcbs import MAX_BEAM_WIDTH, BeamRow, KcbsSearch, StepResult, run_kcbs

LOG_HALF = math.log(0.5)


def test_search_starts_with_one_empty_row_and_needs_no_mask_without_eos() -> None:
    search = KcbsSearch(2, 3, True)
    assert search.pending() == [BeamRow((), 0.0)]
    assert search.step == 0
    assert not search.done
    assert not search.mask_eos


def test_block_policy_asks_for_eos_masking_and_stop_policy_does_not() -> None:
    assert KcbsSearch(2, 3, True, eos_token_id=5, eos_policy="block").mask_eos
    assert not KcbsSearch(2, 3, True, eos_token_id=5, eos_policy="stop").mask_eos


def test_scores_are_renormalised_within_the_top_k() -> None:
    search = KcbsSearch(2, 1, True)
    search.advance([([7, 3], [math.log(0.3), math.log(0.1)])])
    result = search.result()
    assert [s.token_ids for s in result.sequences] == [(7,), (3,)]
    assert [s.probability for s in result.sequences] == pytest.approx([0.75, 0.25], abs=1e-15)
    assert result.captured_probability == pytest.approx(1.0, abs=1e-15)
    assert result.rows_evaluated == 1


def test_equal_scores_are_ordered_by_smaller_token_ids() -> None:
    search = KcbsSearch(3, 2, True)
    search.advance([([9, 4], [LOG_HALF, LOG_HALF])])
    assert search.pending() == [BeamRow((4,), LOG_HALF), BeamRow((9,), LOG_HALF)]
    search.advance([([2, 1], [LOG_HALF, LOG_HALF]), ([0, 8], [LOG_HALF, LOG_HALF])])
    assert [s.token_ids for s in search.result().sequences] == [(4, 1), (4, 2), (9, 0)]


def test_live_beams_stream_the_current_beam_with_running_beams_unfinished() -> None:
    search = KcbsSearch(2, 2, True, eos_token_id=0, eos_policy="stop")
    search.advance([([0, 1], [math.log(0.6), math.log(0.4)])])
    assert [(s.token_ids, s.finish_reason) for s in search.live_beams()] == [((0,), "stop"), ((1,), None)]
    assert search.pending() == [BeamRow((1,), math.log(0.4))]


def test_finished_beam_carries_over_and_competes_in_later_pruning() -> None:
    search = KcbsSearch(2, 2, True, eos_token_id=0, eos_policy="stop")
    search.advance([([0, 1], [math.log(0.6), math.log(0.4)])])
    search.advance([([2, 3], [math.log(0.9), math.log(0.1)])])
    result = search.result()
    assert [(s.token_ids, s.finish_reason) for s in result.sequences] == [((0,), "stop"), ((1, 2), "length")]
    assert [s.probability for s in result.sequences] == pytest.approx([0.6, 0.36], abs=1e-15)


def test_search_is_done_early_when_every_beam_emitted_eos() -> None:
    search = KcbsSearch(2, 5, False, eos_token_id=0, eos_policy="stop")
    search.advance([([0, 1], [math.log(0.6), math.log(0.4)])])
    search.advance([([0, 2], [0.0, -math.inf])])
    assert search.done
    assert search.pending() == []
    assert not search.mask_eos
    result = search.result()
    assert result.steps == 2
    assert [(s.token_ids, s.finish_reason) for s in result.sequences] == [((0,), "stop"), ((1, 0), "stop")]
    assert result.captured_probability == pytest.approx(1.0, abs=1e-15)


def test_unpruned_final_step_keeps_every_candidate() -> None:
    search = KcbsSearch(2, 2, False)
    search.advance([([1, 2], [LOG_HALF, LOG_HALF])])
    search.advance([([3, 4], [LOG_HALF, LOG_HALF])] * 2)
    result = search.result()
    assert len(result.sequences) == 4
    assert result.captured_probability == 1.0


def test_masked_padding_entries_are_ignored() -> None:
    search = KcbsSearch(3, 1, True)
    search.advance([([1, 2, 3], [-math.inf, LOG_HALF, LOG_HALF])])
    assert [s.token_ids for s in search.result().sequences] == [(2,), (3,)]


def test_run_kcbs_matches_stepping_by_hand() -> None:
    calls: list[tuple[int, bool]] = []

    def step_fn(rows: list[BeamRow], mask_eos: bool) -> list[StepResult]:
        calls.append((len(rows), mask_eos))
        return [([1, 2], [math.log(0.7), math.log(0.3)]) for _ in rows]

    result = run_kcbs(step_fn, beam_width=2, steps=3, final_prune=True, eos_token_id=0)
    assert calls == [(1, True), (2, True), (2, True)]
    assert [s.token_ids for s in result.sequences] == [(1, 1, 1), (1, 1, 2)]
    assert result.rows_evaluated == 5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"beam_width": 0}, "beam_width"),
        ({"beam_width": MAX_BEAM_WIDTH + 1}, "beam_width"),
        ({"beam_width": True}, "beam_width"),
        ({"beam_width": 2.0}, "beam_width"),
        ({"steps": 0}, "steps"),
        ({"eos_policy": "sometimes"}, "eos_policy"),
    ],
)
def test_invalid_parameters_raise_value_error(kwargs: dict[str, object], message: str) -> None:
    params: dict[str, object] = {"beam_width": 2, "steps": 2, "final_prune": True, **kwargs}
    with pytest.raises(ValueError, match=message):
        KcbsSearch(**params)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (([1, 2], [LOG_HALF]), "logprobs"),
        (([1, 2, 3], [-1.0, -2.0, -3.0]), "more than beam_width"),
        (([1, 1], [LOG_HALF, LOG_HALF]), "duplicate"),
        (([1, 2], [math.nan, LOG_HALF]), "invalid logprob"),
        (([1, 2], [math.inf, LOG_HALF]), "invalid logprob"),
        (([1, 2], [-math.inf, -math.inf]), "no token with finite logprob"),
        (([0, 2], [LOG_HALF, LOG_HALF]), "must be masked"),
    ],
)
def test_malformed_step_results_raise_value_error(row: StepResult, message: str) -> None:
    search = KcbsSearch(2, 2, True, eos_token_id=0, eos_policy="block")
    with pytest.raises(ValueError, match=message):
        search.advance([row])


def test_results_for_the_wrong_number_of_rows_raise_value_error() -> None:
    with pytest.raises(ValueError, match="pending rows"):
        KcbsSearch(2, 2, True).advance([])


def test_using_a_search_out_of_order_raises_runtime_error() -> None:
    search = KcbsSearch(1, 1, True)
    with pytest.raises(RuntimeError, match="not finished"):
        search.result()
    search.advance([([1], [0.0])])
    with pytest.raises(RuntimeError, match="finished"):
        search.advance([([1], [0.0])])


def test_every_end_of_sequence_id_is_blocked_or_ends_a_beam() -> None:
    """A chat model ends on its end-of-turn token as well as the document's EOS: both count."""
    blocking = KcbsSearch(2, 2, True, eos_token_id={0, 7}, eos_policy="block")
    assert blocking.mask_eos
    with pytest.raises(ValueError, match="EOS"):
        blocking.advance([([7, 3], [-0.5, -1.0])])
    stopping = KcbsSearch(2, 2, True, eos_token_id=frozenset({0, 7}), eos_policy="stop")
    stopping.advance([([7, 3], [-0.5, -1.0])])
    assert [s.finish_reason for s in stopping.live_beams()] == ["stop", None]
