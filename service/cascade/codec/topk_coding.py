"""One token ↔ arithmetic code under a top-k distribution: the step shared by encoder and decoder.

Both sides call these with the same (ids, logprobs) — the engine's raw top-k log-probabilities
for that position — so they build the same integer frequency table and stay in lockstep.
"""

from __future__ import annotations

from collections.abc import Sequence

from cascade.codec.distribution import build_distribution
from cascade.codec.range_coder import Decoder, Encoder
from cascade.codec.token_coding import decode_token, encode_token


def encode_next_token(encoder: Encoder, ids: Sequence[int], logprobs: Sequence[float], token: int,
                      vocab_size: int, precision_bits: int) -> bytes:
    """Code ``token`` (escape + fallback when outside the top-k); returns bytes that became final."""
    dist = build_distribution(ids, logprobs, vocab_size, precision_bits)
    return encode_token(encoder, dist, token, vocab_size)


def decode_next_token(decoder: Decoder, ids: Sequence[int], logprobs: Sequence[float], vocab_size: int,
                      precision_bits: int) -> int:
    """The token the encoder coded at this position."""
    dist = build_distribution(ids, logprobs, vocab_size, precision_bits)
    return decode_token(decoder, dist, vocab_size)
