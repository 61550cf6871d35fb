"""One token through the coder: its top-k symbol, or escape followed by its rank among the rest.

A token outside the top-k is coded as the escape symbol, then as its rank in the ascending list of
the ``vocab_size − k`` ids *not* in the top-k, under a uniform distribution. So every token id is
encodable, whatever the model thinks of it.
"""

from __future__ import annotations

import math

import numpy as np

from cascade.codec.distribution import Distribution
from cascade.codec.range_coder import Decoder, Encoder


def fallback_total(dist: Distribution, vocab_size: int) -> int:
    """How many ids the escape's uniform fallback ranges over."""
    return vocab_size - int(dist.token_ids.size)


def complement_rank(top_ids: np.ndarray, token_id: int) -> int:
    """Rank of ``token_id`` (not in ``top_ids``) among the ids outside ``top_ids``, ascending."""
    return token_id - int(np.count_nonzero(top_ids < token_id))


def complement_token(top_ids: np.ndarray, rank: int) -> int:
    """The id outside ``top_ids`` whose ``complement_rank`` is ``rank``."""
    ordered = np.sort(top_ids)
    skipped_before = ordered - np.arange(ordered.size)
    return rank + int(np.searchsorted(skipped_before, rank, side="right"))


def encode_token(encoder: Encoder, dist: Distribution, token_id: int, vocab_size: int) -> bytes:
    """Code ``token_id`` under ``dist``; returns the bytes that became final."""
    if not 0 <= token_id < vocab_size:
        raise ValueError(f"token {token_id} is outside the vocabulary [0, {vocab_size})")
    symbol = dist.symbol_for_token(token_id)
    low, freq = dist.interval(symbol)
    out = encoder.encode(low, freq, dist.precision_bits)
    if symbol == dist.escape_index:
        out += encoder.encode_with_total(complement_rank(dist.token_ids, token_id), 1,
                                         fallback_total(dist, vocab_size))
    return out


def decode_token(decoder: Decoder, dist: Distribution, vocab_size: int) -> int:
    """The token ``encode_token`` coded under the same ``dist``."""
    symbol = dist.symbol_at(decoder.decode_target(dist.precision_bits))
    low, freq = dist.interval(symbol)
    decoder.consume(low, freq, dist.precision_bits)
    if symbol != dist.escape_index:
        return int(dist.token_ids[symbol])
    total = fallback_total(dist, vocab_size)
    rank = decoder.decode_target_with_total(total)
    decoder.consume_with_total(rank, 1, total)
    return complement_token(dist.token_ids, rank)


def coded_bits(dist: Distribution, token_id: int, vocab_size: int) -> float:
    """The code length ``encode_token`` spends on ``token_id`` under the integer table, in bits."""
    symbol = dist.symbol_for_token(token_id)
    _, freq = dist.interval(symbol)
    bits = dist.precision_bits - math.log2(freq)
    if symbol == dist.escape_index:
        bits += math.log2(fallback_total(dist, vocab_size))
    return bits
