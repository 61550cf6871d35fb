"""What k-CBS's numbers mean: probabilities under top-k sampling (≤ 1), the model's own probability beside
them, EOS blocked at every step under "block", and text targets matched on text."""

from __future__ import annotations

import math

from cascade.kcbs import KcbsSearch, match_target

EOS = 9


def test_captured_probability_never_exceeds_one_by_rounding() -> None:
    search = KcbsSearch(5, 1, True)
    search.advance([([0, 1, 2, 3, 4], [-2.3179726109001058, -1.7196179230121853, -2.9978733658109418,
                                       -3.1048233214868395, -1.3754937727688095])])
    assert math.fsum(s.probability for s in search.result().sequences) > 1.0
    assert search.result().captured_probability == 1.0


def test_sequences_carry_the_models_own_log_probability() -> None:
    search = KcbsSearch(2, 2, True)
    search.advance([([1, 2], [-0.5, -1.0], [-1.5, -2.0])])
    search.advance([([3, 4], [-0.1, -3.0], [-0.2, -6.0]), ([3, 4], [-0.1, -3.0], [-0.3, -6.0])])
    best = search.result().sequences[0]
    assert best.token_ids == (1, 3)
    assert best.model_logprob == -1.5 + -0.2
    assert best.probability > math.exp(best.model_logprob)


def test_model_log_probability_is_absent_when_the_driver_gives_no_raw_values() -> None:
    search = KcbsSearch(2, 1, True)
    search.advance([([1, 2], [-0.5, -1.0])])
    assert all(s.model_logprob is None for s in search.result().sequences)


def test_block_masks_eos_at_every_step_the_last_included() -> None:
    search = KcbsSearch(2, 3, True, eos_token_id=EOS, eos_policy="block")
    masked = []
    while not search.done:
        masked.append(search.mask_eos)
        search.advance([([1, 2], [-0.5, -1.0]) for _ in search.pending()])
    assert masked == [True, True, True]
    assert all(len(s.token_ids) == 3 and EOS not in s.token_ids for s in search.result().sequences)


def test_stop_lets_eos_end_a_beam_before_the_last_step() -> None:
    search = KcbsSearch(2, 3, True, eos_token_id=EOS, eos_policy="stop")
    assert not search.mask_eos
    search.advance([([EOS, 2], [-0.1, -3.0])])
    assert search.live_beams()[0].finish_reason == "stop" and search.live_beams()[0].token_ids == (EOS,)


def test_a_sequence_with_the_targets_text_is_an_exact_match_in_any_tokenisation() -> None:
    search = KcbsSearch(2, 2, True)
    search.advance([([201, 5], [-0.1, -3.0])])
    search.advance([([201, 6], [-0.1, -3.0]), ([201, 6], [-0.1, -3.0])])
    result = search.result()
    assert result.sequences[0].token_ids == (201, 201)
    by_ids = match_target(result, [442], 0)
    assert not by_ids.exact
    by_text = match_target(result, [442], 0, same_text=[True, False])
    assert by_text.exact and by_text.matches == [0]
    assert by_text.near_verbatim_probability == result.sequences[0].probability
