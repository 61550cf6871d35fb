"""Top-k log-probabilities → integer frequency table, identically on every machine.

Steps (all after the first are integer-only, so encoder and decoder agree bit for bit whenever
they are given the same float32 log-probabilities):

1. quantise each log-probability to ``q = round(logprob · 2**16)`` (exact float arithmetic),
   clamped to ``[-48·2**16, 0]``;
2. weight ``w = 2**62 · 2**(-bits)`` with ``bits = -q / ln 2`` computed in fixed point; the
   fractional power comes from a 4096-entry table built with ``decimal`` (correctly rounded, so
   the same everywhere);
3. the escape symbol gets the mass the top-k leaves: ``2**62 − Σ w`` (at least one unit);
4. frequencies: one unit per symbol, the rest in proportion to the weights (floor), and the
   rounding remainder goes to the most likely symbol. They sum to exactly ``2**precision_bits``.

Canonical order: (quantised logprob descending, token id ascending), then escape — so ties and the
order the engine listed the top-k in cannot change the table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, localcontext

import numpy as np

Q_BITS = 16
Q_MIN = -48 << Q_BITS
WEIGHT_BITS = 62
TABLE_BITS = 12
LOG2E_Q32 = 6196328019  # round(2**32 / ln 2)
PRECISIONS = (16, 24, 32)


def _pow2_table() -> np.ndarray:
    with localcontext() as ctx:
        ctx.prec = 40
        scale = Decimal(2) ** WEIGHT_BITS
        ln2 = Decimal(2).ln()
        values = [int((scale * (-(ln2 * j) / (1 << TABLE_BITS)).exp()).to_integral_value())
                  for j in range(1 << TABLE_BITS)]
    return np.array(values, dtype=np.int64)


_POW2 = _pow2_table()


def quantise(logprobs: Sequence[float] | np.ndarray) -> np.ndarray:
    """Fixed-point log-probabilities (units of 2**-16 nats); NaN and -inf clamp to the floor."""
    values = np.asarray(logprobs, dtype=np.float64)
    values = np.nan_to_num(values, nan=-1e9, neginf=-1e9, posinf=0.0)
    q = np.rint(values * (1 << Q_BITS)).astype(np.int64)
    return np.clip(q, Q_MIN, 0)


def weights(q: np.ndarray) -> np.ndarray:
    """Integer weights 2**62·exp(q / 2**16), machine independent."""
    y = (-q * LOG2E_Q32) >> 32
    whole = y >> Q_BITS
    frac = (y & ((1 << Q_BITS) - 1)) >> (Q_BITS - TABLE_BITS)
    w = _POW2[frac] >> np.minimum(whole, 63)
    return np.where(whole >= WEIGHT_BITS, 0, w)


@dataclass(frozen=True)
class Distribution:
    """Symbols in canonical order (top-k tokens, then escape when present) and their CDF."""

    token_ids: np.ndarray
    cdf: np.ndarray
    escape_index: int | None
    precision_bits: int

    @property
    def total(self) -> int:
        return 1 << self.precision_bits

    def symbol_for_token(self, token_id: int) -> int:
        """The symbol coding ``token_id`` (the escape symbol when it is outside the top-k)."""
        hits = np.flatnonzero(self.token_ids == token_id)
        if hits.size:
            return int(hits[0])
        if self.escape_index is None:
            raise ValueError(f"token {token_id} is not codable under this distribution")
        return self.escape_index

    def interval(self, symbol: int) -> tuple[int, int]:
        low = int(self.cdf[symbol])
        return low, int(self.cdf[symbol + 1]) - low

    def symbol_at(self, target: int) -> int:
        return int(np.searchsorted(self.cdf, target, side="right")) - 1


def build_distribution(token_ids: Sequence[int] | np.ndarray, logprobs: Sequence[float] | np.ndarray,
                       vocab_size: int, precision_bits: int) -> Distribution:
    """The frequency table for one position (see module docstring)."""
    if precision_bits not in PRECISIONS:
        raise ValueError(f"precision_bits must be one of {PRECISIONS}")
    ids = np.asarray(token_ids, dtype=np.int64)
    if ids.ndim != 1 or ids.size == 0 or ids.size != len(logprobs):
        raise ValueError("need one log-probability per token id, at least one token")
    if np.unique(ids).size != ids.size or ids.min() < 0 or ids.max() >= vocab_size:
        raise ValueError("token ids must be distinct and inside the vocabulary")
    q = quantise(logprobs)
    order = np.lexsort((ids, -q))
    ids, q = ids[order], q[order]
    w = [int(x) for x in weights(q).tolist()]
    escape = ids.size < vocab_size
    if escape:
        w.append(max(1, (1 << WEIGHT_BITS) - sum(w)))
    n = len(w)
    total = 1 << precision_bits
    if n > total:
        raise ValueError(f"{n} symbols do not fit precision {precision_bits}")
    spare = total - n
    w_sum = sum(w)
    freqs = np.array([1 + (x * spare) // w_sum for x in w] if w_sum > 0 else [1] * n, dtype=np.int64)
    freqs[0] += total - int(freqs.sum())
    cdf = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(freqs, out=cdf[1:])
    return Distribution(ids, cdf, n - 1 if escape else None, precision_bits)


def ideal_bits(logprob: float) -> float:
    """The model's own code length for a token, in bits (the entropy-coding ideal)."""
    return -logprob / math.log(2)
