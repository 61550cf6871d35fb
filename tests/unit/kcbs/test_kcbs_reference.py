"""k-CBS must reproduce a brute-force reference exactly on fixed toy logits."""

from __future__ import annotations

import math

import pytest
from cascade.kcbs import EosPolicy as Policy
from cascade.kcbs import run_kcbs

from .toy_model import ToyModel, enumerate_sequences, reference_search

MODELS = [ToyModel(seed=s, vocab_size=7) for s in range(3)] + [ToyModel(seed=11, vocab_size=3)]


@pytest.mark.parametrize("policy", ["block", "stop"])
@pytest.mark.parametrize("final_prune", [True, False])
@pytest.mark.parametrize("steps", [1, 2, 3, 4])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_search_matches_brute_force_reference(k: int, steps: int, final_prune: bool, policy: Policy) -> None:
    for model in MODELS:
        result = run_kcbs(
            model.step_fn(k),
            beam_width=k,
            steps=steps,
            final_prune=final_prune,
            eos_token_id=model.eos_token_id,
            eos_policy=policy,
        )
        expected = reference_search(model, k, steps, final_prune, policy)
        everything = enumerate_sequences(model, k, steps, policy)

        assert [s.token_ids for s in result.sequences] == [b.token_ids for b in expected]
        for got, want in zip(result.sequences, expected, strict=True):
            assert got.score == pytest.approx(want.score, abs=1e-6)
            assert got.probability == pytest.approx(everything[got.token_ids], abs=1e-9)
            assert got.finish_reason == ("stop" if want.finished else "length")
        brute_force_sum = math.fsum(everything[s.token_ids] for s in result.sequences)
        assert result.captured_probability == pytest.approx(brute_force_sum, abs=1e-9)


@pytest.mark.parametrize("policy", ["block", "stop"])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_unpruned_two_step_search_captures_the_whole_top_k_tree(k: int, policy: Policy) -> None:
    for model in MODELS:
        result = run_kcbs(
            model.step_fn(k),
            beam_width=k,
            steps=2,
            final_prune=False,
            eos_token_id=model.eos_token_id,
            eos_policy=policy,
        )
        assert {s.token_ids for s in result.sequences} == set(enumerate_sequences(model, k, 2, policy))
        assert result.captured_probability == pytest.approx(1.0, abs=1e-12)
