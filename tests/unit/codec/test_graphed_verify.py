"""Fixed-shape decode passes (``graphs.GraphedVerify``, what a GPU replays as CUDA graphs): attending
over the cache's whole capacity and padding the queries to a power of two leave every integer as
``ExactLlama.verify`` computes it, and a cohort decoding through them decodes the same passes. Off a
GPU the fixed-shape pass runs eagerly, so these run everywhere; tests/portability/test_cuda_device.py
checks the replayed graphs on a GPU."""

from __future__ import annotations

import functools
import random

import pytest
import torch
from cascade.codec.exact.cohort import Cohort
from cascade.codec.exact.graphs import GraphedVerify, padded_size
from cascade.codec.exact.model import ExactConfig, ExactLlama
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.codec.exact_fixtures import TINY, tiny_model, tiny_weights

CAPACITY = 48
NEED = 150  # positions a lane may need: past one growth block of a CPU cohort


@functools.cache
def model_of(kernels: str) -> ExactLlama:
    """The compiled set (``fast`` on this CPU) and the torch set, the one a GPU runs."""
    return tiny_model() if kernels == "fast" else ExactLlama(ExactConfig.from_hf(TINY), tiny_weights(TINY), 128,
                                                             kernels="reference")


def test_a_pass_is_padded_to_the_next_power_of_two() -> None:
    assert [padded_size(n) for n in (1, 2, 3, 4, 5, 8, 9, 17, 32, 33)] == [1, 2, 4, 4, 8, 8, 16, 32, 32, 64]


@pytest.mark.parametrize("kernels", ["fast", "reference"])
@settings(max_examples=10, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(1, 30), st.integers(0, 9)), min_size=1, max_size=4),
       seed=st.integers(0, 999))
def test_a_fixed_shape_pass_computes_the_hidden_states_and_cache_of_verify(
        kernels: str, rows: list[tuple[int, int]], seed: int) -> None:
    """Rows at different lengths, each fed 1 + k tokens: the padded pass over the whole capacity gives
    the same hidden states bit for bit, and leaves the same keys and values at every fed position."""
    model = model_of(kernels)
    rng = random.Random(seed)
    vocab = model.config.vocab_size
    contexts = [[rng.randrange(vocab) for _ in range(length)] for length, _ in rows]
    tokens = [rng.randrange(vocab) for _, k in rows for _ in range(k + 1)]
    cache_rows = [i for i, (_, k) in enumerate(rows) for _ in range(k + 1)]
    positions = [p for length, k in rows for p in range(length, length + k + 1)]
    plain, fixed = (model.allocate_cache(len(rows), CAPACITY) for _ in range(2))
    for cache in (plain, fixed):
        model.prefill(contexts, cache, list(range(len(rows))))
    expected = model.verify(torch.tensor(tokens), plain, torch.tensor(cache_rows), torch.tensor(positions))
    got = GraphedVerify(model)(tokens, cache_rows, positions, fixed)
    assert torch.equal(got, expected)
    for i, (length, k) in enumerate(rows):
        for layer in range(len(plain.keys)):
            assert torch.equal(fixed.keys[layer][i, :, :length + k + 1], plain.keys[layer][i, :, :length + k + 1])
            assert torch.equal(fixed.values[layer][i, :, :length + k + 1],
                               plain.values[layer][i, :, :length + k + 1])


def _decode(model: ExactLlama, graphs: bool, seed: int) -> tuple[list[torch.Tensor], list[int]]:
    """Two segments of a few lanes decoding with random drafts (right or wrong: the pass's states are
    compared, not the tokens); returns every step's hidden states and the cache capacities seen."""
    rng = random.Random(seed)
    vocab = model.config.vocab_size
    cohort = Cohort(model, graphs)
    cohort.join([(f"segment{s}", [rng.randrange(vocab) for _ in range(rng.randrange(1, 12))], [0, 1, 2][:lanes],
                  NEED) for s, lanes in enumerate((2, 3))])
    states, capacities = [], []
    for _ in range(6):
        room = [NEED - n for n in cohort.lengths()]
        drafts = [[rng.randrange(vocab) for _ in range(rng.randrange(0, min(5, r)))] for r in room]
        hidden, _ = cohort.step(drafts)
        states.append(hidden)
        capacities.append(cohort.capacity)
        accepted = [rng.randrange(1, 2 + len(d)) for d in drafts]
        cohort.advance(accepted, [rng.randrange(vocab) for _ in drafts])
    return states, capacities


@pytest.mark.parametrize("kernels", ["fast", "reference"])
def test_a_cohort_decoding_through_fixed_shape_passes_computes_what_it_computes_without(kernels: str) -> None:
    model = model_of(kernels)
    for seed in range(3):
        plain, plain_capacity = _decode(model, False, seed)
        fixed, fixed_capacity = _decode(model, True, seed)
        assert all(torch.equal(a, b) for a, b in zip(plain, fixed, strict=True))
        assert set(fixed_capacity) == {NEED}  # the whole need at once: graphs read the cache by address
        assert plain_capacity[0] < NEED


def test_no_graph_is_captured_off_a_gpu() -> None:
    graphed = GraphedVerify(tiny_model())
    cache = tiny_model().allocate_cache(1, CAPACITY)
    tiny_model().prefill([[1, 2, 3]], cache, [0])
    for _ in range(3):
        graphed([4, 5, 6], [0, 0, 0], [3, 4, 5], cache)
    assert (graphed.capture, graphed.captures, graphed.replays) == (False, 0, 0)
