"""Top-k log-probabilities → integer frequency table, bit-identical on every machine.

The decoder reproduces a token only if it rebuilds *exactly* the encoder's table, so after one
exactly-rounded float step everything is integer arithmetic on values that do not depend on the
machine, the BLAS, numpy's SIMD paths or the order the engine listed the top-k in:

1. quantise: ``q = rint(float64(float32(logprob)) · 2**16)`` (exact scaling, IEEE round half to
   even), clamped to ``[-32·2**16, 0]``; NaN and -inf become the floor, +inf becomes 0;
2. canonical order: (q descending, token id ascending), so ties and input order cannot matter;
3. weight ``w = round(2**31 · exp(q / 2**16))`` as a product of two table entries
   ``HI[-q >> 11] · LO[-q & 2047] >> 31`` (rounded). The tables hold ``round(2**31 · exp(-x))``
   computed with ``decimal``, which is correctly rounded, so they are the same everywhere;
4. escape symbol (only when ``k < vocab_size``): weight ``max(1, 2**31 − Σ w)``, the mass the
   top-k leaves for every other token;
5. frequencies: each symbol gets 1 (so every codable symbol has a non-empty interval) plus its
   share of the ``spare = 2**P − n`` remaining units, rounded on the cumulative weights:
   ``cdf[i] = i + floor(spare · Σ_{j<i} w_j / Σw)``. The sum is exactly ``2**P``.

Sorting uses one int64 key, ``-q · 2**32 + token_id``, so no step depends on how numpy breaks
ties (a stable sort, nearly free on the engine's already-ranked top-k), and every product stays
below 2**63, so numpy's int64 arithmetic is exact.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, localcontext

import numpy as np
import numpy.typing as npt

PRECISIONS = (16, 24, 32)
Q_BITS = 16
Q_FLOOR = -(32 << Q_BITS)
WEIGHT_BITS = 31
_LO_BITS = 11
_ID_BITS = 32
_CLAMP_NATS = 2.0 * Q_FLOOR / (1 << Q_BITS)
_BITMAP_VOCAB = 1 << 20
MAX_VOCAB = 1 << _ID_BITS

IntArray = npt.NDArray[np.int64]


@functools.cache
def _exp_tables() -> tuple[IntArray, IntArray]:
    """``HI[i] = 2**31·exp(-i·2**11 / 2**16)`` and ``LO[j] = 2**31·exp(-j / 2**16)``, correctly rounded."""
    with localcontext() as ctx:
        ctx.prec = 40
        one = Decimal(1 << WEIGHT_BITS)
        scale = Decimal(1 << Q_BITS)

        def entry(x: int) -> int:
            return int((one * (Decimal(-x) / scale).exp()).to_integral_value())

        hi = [entry(i << _LO_BITS) for i in range((-Q_FLOOR >> _LO_BITS) + 1)]
        lo = [entry(j) for j in range(1 << _LO_BITS)]
    return np.array(hi, dtype=np.int64), np.array(lo, dtype=np.int64)


def quantise(logprobs: Sequence[float] | npt.NDArray[np.floating]) -> IntArray:
    """Fixed-point log-probabilities in units of 2**-16 nats, clamped to ``[Q_FLOOR, 0]``.

    Clamping first (``fmax`` maps NaN to the floor) keeps the float32 rounding free of overflow.
    """
    values = np.fmin(np.fmax(np.asarray(logprobs, dtype=np.float64), _CLAMP_NATS), 0.0)
    scaled = values.astype(np.float32).astype(np.float64) * (1 << Q_BITS)
    return np.maximum(np.rint(scaled).astype(np.int64), Q_FLOOR)


def weights(q: IntArray) -> IntArray:
    """``round(2**31 · exp(q / 2**16))`` for quantised log-probabilities, integers only."""
    hi, lo = _exp_tables()
    x = -q
    product: IntArray = hi[x >> _LO_BITS] * lo[x & ((1 << _LO_BITS) - 1)]
    return (product + (1 << (WEIGHT_BITS - 1))) >> WEIGHT_BITS


def cumulative_frequencies(w: IntArray, total: int) -> IntArray:
    """The CDF (``n + 1`` entries, 0 … ``total``) of frequencies ≥ 1 proportional to ``w`` (each ≤ 2**31).

    Symbol ``i`` gets ``1 + floor(spare·W_{i+1}/W) − floor(spare·W_i/W)`` with ``W_i`` the weight
    before it: within one unit of its exact share, and the rounding never accumulates. Weights summing
    above 2**31 (log-probabilities that sum past 1) are first rescaled so every product fits int64.
    """
    n = int(w.size)
    w_sum = int(w.sum())
    if w_sum == 0:
        w, w_sum = np.ones(n, dtype=np.int64), n
    elif w_sum > 1 << WEIGHT_BITS:
        w = (w << WEIGHT_BITS) // w_sum
        w_sum = int(w.sum())
    cdf = np.zeros(n + 1, dtype=np.int64)
    cdf[1:] = np.arange(1, n + 1) + (np.cumsum(w) * (total - n)) // w_sum
    return cdf


@dataclass(frozen=True, eq=False)
class Distribution:
    """One position's symbols in canonical order (the top-k tokens, then escape when present).

    ``cdf`` has ``n + 1`` entries, ``cdf[0] == 0`` and ``cdf[-1] == 2**precision_bits``; symbol ``s``
    owns ``[cdf[s], cdf[s + 1])``.
    """

    token_ids: IntArray
    cdf: IntArray
    escape_index: int | None
    precision_bits: int

    @property
    def total(self) -> int:
        return 1 << self.precision_bits

    @property
    def frequencies(self) -> IntArray:
        return np.diff(self.cdf)

    def symbol_for_token(self, token_id: int) -> int:
        """The symbol coding ``token_id``: its top-k slot, else the escape symbol."""
        hits = np.flatnonzero(self.token_ids == token_id)
        if hits.size:
            return int(hits[0])
        if self.escape_index is None:
            raise ValueError(f"token {token_id} is not in the vocabulary this distribution covers")
        return self.escape_index

    def interval(self, symbol: int) -> tuple[int, int]:
        """``(low, freq)`` of ``symbol`` out of ``2**precision_bits``."""
        low = int(self.cdf[symbol])
        return low, int(self.cdf[symbol + 1]) - low

    def symbol_at(self, target: int) -> int:
        """The symbol whose interval contains ``0 <= target < 2**precision_bits``."""
        return int(np.searchsorted(self.cdf, target, side="right")) - 1


def _validated_ids(token_ids: Sequence[int] | npt.NDArray[np.integer], q: IntArray,
                   vocab_size: int) -> IntArray:
    ids = np.asarray(token_ids)
    if ids.ndim != 1 or q.ndim != 1 or ids.size == 0 or ids.size != q.size:
        raise ValueError(f"need one log-probability per token id and at least one token (got {ids.size} ids, "
                         f"{q.size} log-probabilities)")
    if ids.dtype.kind not in "iu":
        raise ValueError("token ids must be integers")
    ids = ids.astype(np.int64)
    if ids.min() < 0 or ids.max() >= vocab_size:
        raise ValueError(f"token ids must lie in [0, {vocab_size})")
    if _has_duplicates(ids, vocab_size):
        raise ValueError("token ids must be distinct")
    return ids


def _has_duplicates(ids: IntArray, vocab_size: int) -> bool:
    if vocab_size <= _BITMAP_VOCAB:
        seen = np.zeros(vocab_size, dtype=np.bool_)
        seen[ids] = True
        return int(np.count_nonzero(seen)) != ids.size
    ordered = np.sort(ids)
    return bool(np.any(ordered[1:] == ordered[:-1]))


def build_distribution(token_ids: Sequence[int] | npt.NDArray[np.integer],
                       logprobs: Sequence[float] | npt.NDArray[np.floating],
                       vocab_size: int, precision_bits: int) -> Distribution:
    """The frequency table for one position (the steps are in the module docstring)."""
    if precision_bits not in PRECISIONS:
        raise ValueError(f"precision_bits must be one of {PRECISIONS}, got {precision_bits}")
    if not 1 <= vocab_size <= MAX_VOCAB:
        raise ValueError(f"vocab_size must lie in [1, 2**32], got {vocab_size}")
    q = quantise(logprobs)
    ids = _validated_ids(token_ids, q, vocab_size)
    key = np.sort(((-q) << _ID_BITS) | ids, kind="stable")
    ids, q = key & ((1 << _ID_BITS) - 1), -(key >> _ID_BITS)
    w = weights(q)
    escape = ids.size < vocab_size
    n = ids.size + escape
    if n > 1 << precision_bits:
        raise ValueError(f"{n} symbols do not fit {precision_bits}-bit frequencies")
    if escape:
        w = np.append(w, max(1, (1 << WEIGHT_BITS) - int(w.sum())))
    return Distribution(ids, cumulative_frequencies(w, 1 << precision_bits), n - 1 if escape else None,
                        precision_bits)


def ideal_bits(logprob: float) -> float:
    """The model's own code length for a token, in bits: the entropy-coding ideal."""
    return -logprob / math.log(2)
