"""One token through the coder: its top-k symbol, or escape followed by its rank among the rest."""

from __future__ import annotations

import numpy as np

from cascade.codec.distribution import Distribution
from cascade.codec.range_coder import Decoder, Encoder


def _fallback_total(dist: Distribution, vocab_size: int) -> int:
    return vocab_size - int(dist.token_ids.size)


def encode_token(encoder: Encoder, dist: Distribution, token_id: int, vocab_size: int) -> bytes:
    """Bytes that became final while coding ``token_id``."""
    if not 0 <= token_id < vocab_size:
        raise ValueError(f"token {token_id} outside the vocabulary")
    symbol = dist.symbol_for_token(token_id)
    low, freq = dist.interval(symbol)
    out = encoder.encode(low, freq, dist.total)
    if symbol == dist.escape_index:
        rank = token_id - int(np.count_nonzero(dist.token_ids < token_id))
        out += encoder.encode(rank, 1, _fallback_total(dist, vocab_size))
    return out


def decode_token(decoder: Decoder, dist: Distribution, vocab_size: int) -> int:
    """The token ``encode_token`` coded under the same distribution."""
    symbol = dist.symbol_at(decoder.target(dist.total))
    low, freq = dist.interval(symbol)
    decoder.consume(low, freq, dist.total)
    if symbol != dist.escape_index:
        return int(dist.token_ids[symbol])
    rank = decoder.target(_fallback_total(dist, vocab_size))
    decoder.consume(rank, 1, _fallback_total(dist, vocab_size))
    excluded = np.sort(dist.token_ids)
    token = rank
    for t in excluded.tolist():
        if t <= token:
            token += 1
        else:
            break
    return token
