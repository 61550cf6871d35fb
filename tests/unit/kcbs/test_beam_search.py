"""``BeamSearch`` (vLLM's ``use_beam_search`` rule) against exhaustive search and by hand."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from cascade.kcbs.beam_search import Beam, BeamSearch
from hypothesis import given, settings
from hypothesis import strategies as st

from .toy_model import EOS, ToyModel


def _run(model: ToyModel, search: BeamSearch) -> list[Beam]:
    step = model.step_fn(search.candidates_per_row)
    while not search.done:
        search.advance(step(search.pending(), False))
    return search.result()


def _logprob(model: ToyModel, prefix: tuple[int, ...], token: int) -> float:
    logits = model.logits(prefix)
    return float(logits[token] - np.logaddexp.reduce(logits))


def _every_sequence(model: ToyModel, steps: int) -> list[tuple[tuple[int, ...], bool, float]]:
    """Every sequence the search could return: ended by EOS within ``steps`` tokens, or ``steps`` tokens
    without one; with its log-probability."""
    found = []
    for length in range(1, steps + 1):
        for tokens in itertools.product(range(model.vocab_size), repeat=length):
            if EOS in tokens[:-1] or (length < steps and tokens[-1] != EOS):
                continue
            logprob = sum(_logprob(model, tokens[:i], t) for i, t in enumerate(tokens))
            ended = tokens[-1] == EOS
            found.append((tokens[:-1] if ended else tokens, ended, logprob))
    return found


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), vocab=st.integers(2, 4), steps=st.integers(1, 3),
       prompt=st.integers(0, 5), penalty=st.sampled_from([0.0, 0.5, 1.0, 2.0]))
def test_a_beam_wide_enough_to_keep_everything_returns_the_best_sequences_by_score(
        seed: int, vocab: int, steps: int, prompt: int, penalty: float) -> None:
    model = ToyModel(seed, vocab)
    width = min(vocab ** steps, 64)
    result = _run(model, BeamSearch(width, steps, prompt, EOS, length_penalty=penalty))
    every = _every_sequence(model, steps)

    def score(entry: tuple[tuple[int, ...], bool, float]) -> float:
        return entry[2] / max(prompt + len(entry[0]), 1) ** penalty

    best = sorted(every, key=score, reverse=True)[:width]
    assert [(b.token_ids, b.end_token is not None) for b in result] == [(t, e) for t, e, _ in best]
    assert [b.logprob for b in result] == pytest.approx([lp for _, _, lp in best], abs=1e-9)


def test_an_end_token_finishes_its_beam_and_the_rest_keep_the_width() -> None:
    search = BeamSearch(2, 3, prompt_tokens=4, eos_token_id=0)
    search.advance([([0, 5, 6, 7], [math.log(0.4), math.log(0.3), math.log(0.2), math.log(0.1)])])
    assert [row.token_ids for row in search.pending()] == [(5,), (6,)]
    search.advance([([7], [math.log(0.9)]), ([8], [math.log(0.9)])])
    search.advance([([9], [math.log(0.9)]), ([9], [math.log(0.9)])])
    best = search.result()
    assert [(b.token_ids, b.finish_reason, b.end_token) for b in best] == [((5, 7, 9), "length", None),
                                                                          ((), "stop", 0)]
    assert search.score(best[0]) == pytest.approx((math.log(0.3) + 2 * math.log(0.9)) / 7)
    assert search.score(best[1]) == pytest.approx(math.log(0.4) / 4)


def test_length_penalty_favours_longer_beams() -> None:
    def search(penalty: float) -> list[Beam]:
        s = BeamSearch(1, 2, prompt_tokens=0, eos_token_id=0, length_penalty=penalty)
        s.advance([([0, 5], [math.log(0.5), math.log(0.5)])])
        s.advance([([6], [math.log(0.6)])])
        return s.result()

    assert search(0.0)[0].token_ids == ()  # log 0.5 against log 0.3
    assert search(2.0)[0].token_ids == (5, 6)  # log 0.3 / 4 against log 0.5 / 1


def test_ignore_eos_extends_end_tokens_like_any_other() -> None:
    search = BeamSearch(1, 2, prompt_tokens=1, eos_token_id=0, ignore_eos=True)
    search.advance([([0, 5], [math.log(0.6), math.log(0.4)])])
    assert search.pending()[0].token_ids == (0,)


def test_width_one_without_end_tokens_is_greedy_decoding() -> None:
    model = ToyModel(7, 6, eos_token_id=None)
    result = _run(model, BeamSearch(1, 5, 3, None))
    greedy: tuple[int, ...] = ()
    for _ in range(5):
        greedy += (int(np.argmax(model.logits(greedy))),)
    assert result[0].token_ids == greedy


def test_each_step_keeps_its_row_for_the_logprobs() -> None:
    search = BeamSearch(1, 1, prompt_tokens=1, eos_token_id=None)
    search.advance([([3, 4], [math.log(0.2), math.log(0.8)])])
    [beam] = search.result()
    assert beam.token_ids == (4,)
    assert beam.steps == (((4, math.log(0.8)), (3, math.log(0.2))),)


def test_misuse_is_an_error() -> None:
    with pytest.raises(ValueError):
        BeamSearch(0, 1, 0, None)
    with pytest.raises(ValueError):
        BeamSearch(2, 0, 0, None)
    search = BeamSearch(2, 1, 0, None)
    with pytest.raises(RuntimeError):
        search.result()
    with pytest.raises(ValueError):
        search.advance([])
    search.advance([([1], [0.0])])
    with pytest.raises(RuntimeError):
        search.advance([([1], [0.0])])
