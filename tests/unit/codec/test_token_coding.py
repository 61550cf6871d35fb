"""Tokens through distribution + coder: any token id round-trips, escape and fallback included."""

from __future__ import annotations

import math

import numpy as np
import pytest
from cascade.codec.distribution import Distribution, build_distribution
from cascade.codec.range_coder import Decoder, Encoder
from cascade.codec.token_coding import (
    coded_bits,
    complement_rank,
    complement_token,
    decode_token,
    encode_token,
)
from hypothesis import given, settings
from hypothesis import strategies as st

PRECISIONS = st.sampled_from([16, 24, 32])


def _softmax_logprobs(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    return (x - x.max() - math.log(float(np.exp(x - x.max()).sum()))).astype(np.float32)


@st.composite
def positions(draw: st.DrawFn, vocab: int) -> tuple[list[int], list[float], int]:
    """One step: a model's top-k (real log-softmax values) and the token that occurred (any id)."""
    k = draw(st.integers(1, min(vocab, 40)))
    logits = np.array(draw(st.lists(st.floats(-30, 10, width=32), min_size=vocab, max_size=vocab)))
    logprobs = _softmax_logprobs(logits)
    ids = draw(st.lists(st.integers(0, vocab - 1), min_size=k, max_size=k, unique=True))
    token = draw(st.one_of(st.sampled_from(ids), st.integers(0, vocab - 1)))
    return ids, [float(logprobs[i]) for i in ids], token


def _round_trip(dists: list[Distribution], tokens: list[int], vocab: int, chunk: int) -> list[int]:
    encoder = Encoder()
    stream = b"".join(encode_token(encoder, d, t, vocab) for d, t in zip(dists, tokens, strict=True))
    stream += encoder.finish()
    decoder = Decoder(iter([stream[i:i + chunk] for i in range(0, len(stream), chunk)]))
    return [decode_token(decoder, d, vocab) for d in dists]


@settings(max_examples=50, deadline=None)
@given(st.data(), PRECISIONS, st.integers(2, 300), st.integers(1, 9))
def test_random_distributions_and_tokens_round_trip_through_a_chunked_stream(
        data: st.DataObject, precision: int, vocab: int, chunk: int) -> None:
    steps = data.draw(st.lists(positions(vocab), min_size=1, max_size=25))
    dists = [build_distribution(ids, logprobs, vocab, precision) for ids, logprobs, _ in steps]
    tokens = [token for _, _, token in steps]
    assert _round_trip(dists, tokens, vocab, chunk) == tokens


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 70_000).flatmap(lambda v: st.tuples(
    st.just(v), st.lists(st.integers(0, v - 1), min_size=1, max_size=min(v - 1, 50), unique=True),
    st.lists(st.integers(0, v - 1), min_size=1, max_size=10))), PRECISIONS)
def test_escape_and_fallback_round_trip_any_token_id(case: tuple[int, list[int], list[int]],
                                                     precision: int) -> None:
    vocab, top, tokens = case
    dist = build_distribution(top, [-1.0 - i for i in range(len(top))], vocab, precision)
    tokens = [*tokens, 0, vocab - 1]
    assert _round_trip([dist] * len(tokens), tokens, vocab, 4) == tokens


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 60).flatmap(
    lambda v: st.tuples(st.just(v), st.sets(st.integers(0, v - 1), max_size=v - 1))))
def test_complement_rank_and_token_are_inverse(case: tuple[int, set[int]]) -> None:
    vocab, top = case
    top_ids = np.array(sorted(top, reverse=True), dtype=np.int64)
    outside = [t for t in range(vocab) if t not in top]
    assert [complement_rank(top_ids, t) for t in outside] == list(range(len(outside)))
    assert [complement_token(top_ids, r) for r in range(len(outside))] == outside


def test_extreme_distributions_round_trip_at_every_precision() -> None:
    vocab = 8192
    rng = np.random.default_rng(3)
    zipf = _softmax_logprobs(-1.1 * np.log(np.arange(1, vocab + 1)))
    cases = [
        ([5], [0.0]),
        (list(range(64)), [-1e-7] + [-60.0] * 63),
        (list(range(1000)), [-1e-6] + [-25.0] * 999),
        (list(range(vocab)), [float(-np.log(vocab))] * vocab),
        (list(range(vocab)), zipf.tolist()),
        (rng.permutation(vocab)[:4000].tolist(), [-30.0] * 4000),
    ]
    for precision in (16, 24, 32):
        dists, tokens = [], []
        for ids, logprobs in cases:
            dist = build_distribution(ids, logprobs, vocab, precision)
            for token in {ids[0], ids[-1], vocab - 1, 0, int(rng.integers(vocab))}:
                dists.append(dist)
                tokens.append(token)
        assert _round_trip(dists, tokens, vocab, 1000) == tokens


def test_coded_bits_predicts_the_stream_length() -> None:
    vocab = 1000
    rng = np.random.default_rng(5)
    encoder = Encoder()
    stream = b""
    expected = 0.0
    for _ in range(400):
        logprobs = _softmax_logprobs(rng.standard_normal(vocab) * 3)
        top = np.argsort(-logprobs)[:20]
        dist = build_distribution(top, logprobs[top], vocab, 24)
        probs = np.exp(logprobs.astype(np.float64))
        token = int(rng.choice(vocab, p=probs / probs.sum()))
        expected += coded_bits(dist, token, vocab)
        stream += encode_token(encoder, dist, token, vocab)
    stream += encoder.finish()
    assert expected <= 8 * len(stream) <= expected + 16


def test_token_outside_the_vocabulary_is_rejected() -> None:
    dist = build_distribution([1, 2], [-0.5, -1.5], 10, 16)
    with pytest.raises(ValueError):
        encode_token(Encoder(), dist, 10, 10)
    with pytest.raises(ValueError):
        encode_token(Encoder(), dist, -1, 10)
