"""Properties of k-CBS results that must hold for any logits."""

from __future__ import annotations

import math

import numpy as np
from cascade.kcbs import BeamRow, EosPolicy, KcbsResult, StepResult, run_kcbs
from hypothesis import given, settings
from hypothesis import strategies as st

from .toy_model import EOS, ToyModel

SETTINGS = settings(max_examples=60, deadline=None)

seeds = st.integers(min_value=0, max_value=2**32 - 1)
widths = st.integers(min_value=1, max_value=6)
lengths = st.integers(min_value=1, max_value=5)
vocab_sizes = st.integers(min_value=2, max_value=12)
policies = st.sampled_from(["block", "stop"])


def search(model: ToyModel, k: int, steps: int, final_prune: bool, policy: EosPolicy) -> KcbsResult:
    return run_kcbs(
        model.step_fn(k),
        beam_width=k,
        steps=steps,
        final_prune=final_prune,
        eos_token_id=model.eos_token_id,
        eos_policy=policy,
    )


@SETTINGS
@given(seed=seeds, k=widths, vocab=vocab_sizes, policy=policies, final_prune=st.booleans())
def test_single_step_returns_the_top_k_tokens_with_total_probability_one(
    seed: int, k: int, vocab: int, policy: EosPolicy, final_prune: bool
) -> None:
    model = ToyModel(seed, vocab)
    result = search(model, k, 1, final_prune, policy)
    logits = model.logits(())
    allowed = [t for t in range(vocab) if policy == "stop" or t != EOS]
    top = sorted(allowed, key=lambda t: -logits[t])[:k]
    assert [s.token_ids for s in result.sequences] == [(t,) for t in top]
    assert abs(result.captured_probability - 1.0) <= 1e-12


@SETTINGS
@given(seed=seeds, k=widths, steps=lengths, vocab=vocab_sizes, policy=policies)
def test_keeping_all_final_candidates_captures_at_least_as_much_as_pruning(
    seed: int, k: int, steps: int, vocab: int, policy: EosPolicy
) -> None:
    model = ToyModel(seed, vocab)
    unpruned = search(model, k, steps, False, policy)
    pruned = search(model, k, steps, True, policy)
    assert {s.token_ids for s in pruned.sequences} <= {s.token_ids for s in unpruned.sequences}
    assert unpruned.captured_probability >= pruned.captured_probability - 1e-12
    assert len(unpruned.sequences) <= k * k
    assert len(pruned.sequences) <= k


@SETTINGS
@given(
    seed=seeds,
    k=widths,
    steps=lengths,
    vocab=vocab_sizes,
    policy=policies,
    final_prune=st.booleans(),
    eos_bias=st.sampled_from([-5.0, 0.0, 3.0, 30.0]),
)
def test_captured_probability_never_exceeds_one_and_sequences_come_best_first(
    seed: int, k: int, steps: int, vocab: int, policy: EosPolicy, final_prune: bool, eos_bias: float
) -> None:
    result = search(ToyModel(seed, vocab, eos_bias=eos_bias), k, steps, final_prune, policy)
    assert result.captured_probability <= 1.0 + 1e-12
    ranks = [(-s.score, s.token_ids) for s in result.sequences]
    assert ranks == sorted(ranks)
    assert all(s.probability == math.exp(s.score) for s in result.sequences)


@SETTINGS
@given(seed=seeds, k=widths, steps=st.integers(min_value=2, max_value=4), extra=st.integers(0, 4))
def test_unpruned_search_returns_k_squared_sequences_when_the_vocab_allows(
    seed: int, k: int, steps: int, extra: int
) -> None:
    model = ToyModel(seed, vocab_size=k + 1 + extra)
    result = search(model, k, steps, False, "block")
    assert len(result.sequences) == k * k


@SETTINGS
@given(seed=seeds, k=widths, steps=lengths, vocab=vocab_sizes, final_prune=st.booleans())
def test_blocked_eos_gives_exactly_steps_tokens_and_no_eos(
    seed: int, k: int, steps: int, vocab: int, final_prune: bool
) -> None:
    result = search(ToyModel(seed, vocab, eos_bias=30.0), k, steps, final_prune, "block")
    assert result.steps == steps
    for sequence in result.sequences:
        assert len(sequence.token_ids) == steps
        assert EOS not in sequence.token_ids
        assert sequence.finish_reason == "length"


@SETTINGS
@given(seed=seeds, k=widths, steps=lengths, vocab=vocab_sizes, final_prune=st.booleans())
def test_stop_policy_ends_beams_at_their_first_eos(
    seed: int, k: int, steps: int, vocab: int, final_prune: bool
) -> None:
    result = search(ToyModel(seed, vocab, eos_bias=2.0), k, steps, final_prune, "stop")
    for sequence in result.sequences:
        if sequence.finish_reason == "stop":
            assert sequence.token_ids[-1] == EOS
            assert EOS not in sequence.token_ids[:-1]
        else:
            assert sequence.finish_reason == "length"
            assert len(sequence.token_ids) == steps
            assert EOS not in sequence.token_ids


@SETTINGS
@given(seed=seeds, k=widths, steps=lengths, vocab=vocab_sizes, policy=policies)
def test_result_does_not_depend_on_the_order_of_each_rows_top_k(
    seed: int, k: int, steps: int, vocab: int, policy: EosPolicy
) -> None:
    step = ToyModel(seed, vocab).step_fn(k)

    def reversed_step(rows: list[BeamRow], mask_eos: bool) -> list[StepResult]:
        return [(list(reversed(ids)), list(reversed(lps))) for ids, lps in step(rows, mask_eos)]

    forward, backward = (
        run_kcbs(fn, beam_width=k, steps=steps, final_prune=False, eos_token_id=EOS, eos_policy=policy)
        for fn in (step, reversed_step)
    )
    assert [s.token_ids for s in forward.sequences] == [s.token_ids for s in backward.sequences]
    np.testing.assert_allclose(
        [s.score for s in forward.sequences], [s.score for s in backward.sequences], rtol=0, atol=1e-12
    )
