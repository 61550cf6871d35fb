"""Arithmetic coder + distribution: exact round trips for any distribution, precision and token."""

from __future__ import annotations

import numpy as np
from cascade.codec.distribution import build_distribution
from cascade.codec.range_coder import MAX_TOTAL, Decoder, Encoder
from cascade.codec.token_coding import decode_token, encode_token
from hypothesis import given, settings
from hypothesis import strategies as st

PRECISIONS = st.sampled_from([16, 24, 32])


@st.composite
def positions(draw: st.DrawFn, vocab: int) -> tuple[list[int], list[float], int]:
    k = draw(st.integers(1, min(vocab, 40)))
    ids = draw(st.lists(st.integers(0, vocab - 1), min_size=k, max_size=k, unique=True))
    raw = draw(st.lists(st.floats(-30, 10, allow_nan=False), min_size=vocab, max_size=vocab))
    logits = np.array(raw)
    logprobs = logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
    token = draw(st.one_of(st.sampled_from(ids), st.integers(0, vocab - 1)))
    return ids, [float(np.float32(logprobs[i])) for i in ids], token


@settings(max_examples=60, deadline=None)
@given(st.data(), PRECISIONS, st.integers(2, 300))
def test_random_distributions_and_tokens_round_trip(data: st.DataObject, precision: int, vocab: int) -> None:
    steps = data.draw(st.lists(positions(vocab), min_size=1, max_size=25))
    encoder = Encoder()
    stream = b""
    dists = []
    for ids, logprobs, token in steps:
        dist = build_distribution(ids, logprobs, vocab, precision)
        dists.append(dist)
        stream += encode_token(encoder, dist, token, vocab)
    stream += encoder.finish()
    decoder = Decoder(iter([stream[i:i + 3] for i in range(0, len(stream), 3)]))
    assert [decode_token(decoder, d, vocab) for d in dists] == [token for _, _, token in steps]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, MAX_TOTAL), st.data()), min_size=1, max_size=40))
def test_arbitrary_totals_mix_in_one_stream(symbols: list) -> None:
    chosen = []
    encoder = Encoder()
    out = b""
    for total, data in symbols:
        low = data.draw(st.integers(0, total - 1))
        freq = data.draw(st.integers(1, total - low))
        chosen.append((low, freq, total))
        out += encoder.encode(low, freq, total)
    out += encoder.finish()
    decoder = Decoder(out)
    for low, freq, total in chosen:
        target = decoder.target(total)
        assert low <= target < low + freq
        decoder.consume(low, freq, total)


@settings(max_examples=30, deadline=None)
@given(PRECISIONS, st.permutations(list(range(12))))
def test_canonical_order_ignores_input_order_and_ties(precision: int, order: list[int]) -> None:
    ids = [3, 9, 1, 7, 5, 11, 2, 8, 0, 4, 6, 10]
    logprobs = [-1.0, -1.0, -2.5, -2.5, -2.5, -3.0, -4.0, -4.0, -5.0, -6.0, -7.0, -8.0]
    a = build_distribution(ids, logprobs, 50, precision)
    b = build_distribution([ids[i] for i in order], [logprobs[i] for i in order], 50, precision)
    assert np.array_equal(a.token_ids, b.token_ids) and np.array_equal(a.cdf, b.cdf)


@settings(max_examples=40, deadline=None)
@given(PRECISIONS, st.integers(2, 2000), st.floats(-60, 0))
def test_frequencies_sum_exactly_and_every_symbol_is_codable(precision: int, vocab: int, spread: float) -> None:
    k = min(vocab, 200)
    logprobs = [spread * i / k for i in range(k)]
    dist = build_distribution(list(range(k)), logprobs, vocab, precision)
    freqs = np.diff(dist.cdf)
    assert int(dist.cdf[-1]) == 1 << precision
    assert (freqs >= 1).all()
    assert (dist.escape_index is None) == (k == vocab)


def test_extreme_distributions_round_trip() -> None:
    vocab = 8192
    cases = [
        ([5], [0.0]),
        (list(range(64)), [-1e-7] + [-60.0] * 63),
        (list(range(vocab)), [float(-np.log(vocab))] * vocab),
        (list(range(50_000 % vocab)), [-30.0] * (50_000 % vocab)),
    ]
    for precision in (16, 24, 32):
        encoder = Encoder()
        out = b""
        expected = []
        dists = []
        for ids, logprobs in cases:
            dist = build_distribution(ids, logprobs, vocab, precision)
            for token in (ids[0], ids[-1], vocab - 1, 0):
                out += encode_token(encoder, dist, token, vocab)
                expected.append(token)
                dists.append(dist)
        out += encoder.finish()
        decoder = Decoder(out)
        assert [decode_token(decoder, d, vocab) for d in dists] == expected


def test_truncated_stream_decodes_without_hanging() -> None:
    dist = build_distribution([0, 1, 2], [-0.5, -1.5, -2.5], 10, 32)
    encoder = Encoder()
    out = b"".join(encode_token(encoder, dist, t % 10, 10) for t in range(200)) + encoder.finish()
    decoder = Decoder(out[: len(out) // 3])
    tokens = [decode_token(decoder, dist, 10) for _ in range(200)]
    assert len(tokens) == 200
