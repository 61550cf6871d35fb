"""Integer logits → integer frequency tables for many positions at once (torch int64, exact).

Per row (the full derivation is in docs/codec-format.md, "Frequency table, version 3"), with
``z`` the logits in units of 2**-16 nats and ``d = min(max(z) − z, 32·2**16)``:

1. symbols: the top-k ids by ``(z descending, id ascending)`` — one unique int64 key per id, so
   ties cannot make the choice machine dependent — then the escape symbol;
2. a top-k symbol weighs ``round(2**31 · e^(−d / 2**16))`` as ``HI[d >> 11] · LO[d & 2047]``
   (rounded), from two correctly rounded ``decimal`` tables (the arg-max weighs exactly 2**31);
3. the escape weighs the rest of the vocabulary, ``Σ C[d >> 6]`` over the ids outside the top-k,
   with ``C[j] = round(2**31 · e^(−j / 2**10))`` (one coarser table: one gather per id);
4. every weight is shifted right by ``s = max(0, bitlength(W) − 31)`` (``W``: their total) and
   ``cdf[i] = i + floor((2**P − n) · (u_0 + … + u_{i−1}) / U)``, so every symbol gets ≥ 1 and the
   table sums to exactly 2**P.

All of it is int64 arithmetic whose values provably fit (bounds in the comments), so it is the same
on every machine and device. On the CPU it runs as one compiled loop per row (``_compiled_tables``,
numba) — integers only, so nothing can round differently; the top-k keys are selected from the ids
whose ``(top − z) >> 12`` bucket reaches the k-th largest (a histogram pass), placed bucket by bucket
and each bucket sorted: the same keys in the order ``torch.topk`` returns them, since the keys are unique
and the buckets follow the logits' order. (One sort of the ~1,040 keys of a row was two thirds of the
tables' time; a bucket of 1/16 nat holds a few keys, sorted by insertion.)
"""

from __future__ import annotations

import functools
from decimal import Decimal, localcontext
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from cascade.codec.exact import dispatch, kernel_cache
from cascade.codec.exact.tables import exact_context

Q_BITS = 16
D_MAX = 32 << Q_BITS
WEIGHT_BITS = 31
_LO_BITS = 11
_COARSE_SHIFT = 6
_Z_LIMIT = 1 << 36
_BUCKET_SHIFT = 12
_INSERTION_KEYS = 48
"""A bucket of at most this many keys is sorted by insertion (a real row's buckets hold a few each)."""
ESCAPE_BITS = 32
"""An escaped token's table (container version 4) sums to 2**32."""

try:
    from numba import prange

    @kernel_cache.njit(parallel=True, nogil=True)
    def _compiled_tables(logits: Any, bits: int, hi: Any, lo: Any, coarse: Any, precision_bits: int, ids: Any,
                         cdf: Any) -> None:  # pragma: no cover - compiled
        rows, vocab = logits.shape
        k = ids.shape[1]
        spare = (1 << precision_bits) - (k + 1)
        for r in prange(rows):
            z = np.empty(vocab, dtype=np.int64)
            top = -_Z_LIMIT
            for j in range(vocab):
                z[j] = min(max(logits[r, j], -_Z_LIMIT), _Z_LIMIT)
                top = max(top, z[j])
            d = np.empty(vocab, dtype=np.int64)
            for j in range(vocab):
                d[j] = min(top - z[j], D_MAX)
            escape = 0
            for j in range(vocab):  # apart from the histogram's scatter below: measured faster so
                escape += coarse[d[j] >> _COARSE_SHIFT]
            counts = np.zeros((D_MAX >> _BUCKET_SHIFT) + 1, dtype=np.int64)
            for j in range(vocab):
                counts[d[j] >> _BUCKET_SHIFT] += 1
            last, seen = 0, counts[0]
            while seen < k:
                last += 1
                seen += counts[last]
            # the keys of buckets 0..last, largest first: placed bucket by bucket, then each bucket sorted
            starts = np.empty(last + 2, dtype=np.int64)
            starts[0] = 0
            for b in range(last + 1):
                starts[b + 1] = starts[b] + counts[b]
            fill = starts[:last + 1].copy()
            keys = np.empty(seen, dtype=np.int64)
            for j in range(vocab):
                b = d[j] >> _BUCKET_SHIFT
                if b <= last:
                    keys[fill[b]] = z[j] * (1 << bits) + (vocab - 1 - j)
                    fill[b] += 1
            for b in range(last + 1):
                first, end = starts[b], starts[b + 1]
                if end - first > _INSERTION_KEYS:
                    ordered = np.sort(keys[first:end])
                    for i in range(end - first):
                        keys[first + i] = ordered[end - first - 1 - i]
                    continue
                for i in range(first + 1, end):
                    key = keys[i]
                    at = i
                    while at > first and keys[at - 1] < key:
                        keys[at] = keys[at - 1]
                        at -= 1
                    keys[at] = key
            weights = np.empty(k + 1, dtype=np.int64)
            total = 0
            for i in range(k):
                key = keys[i]
                ids[r, i] = (vocab - 1) - (key & ((1 << bits) - 1))
                gap = min(top - (key >> bits), D_MAX)
                weights[i] = (hi[gap >> _LO_BITS] * lo[gap & ((1 << _LO_BITS) - 1)] + (1 << (WEIGHT_BITS - 1))
                              ) >> WEIGHT_BITS
                escape -= coarse[gap >> _COARSE_SHIFT]
                total += weights[i]
            weights[k] = escape
            total += escape
            length = 0
            while total >> length:
                length += 1
            shift = max(0, length - WEIGHT_BITS)
            u_total = 0
            for i in range(k + 1):
                weights[i] >>= shift
                u_total += weights[i]
            running = 0
            cdf[r, 0] = 0
            for i in range(k + 1):
                running += weights[i]
                cdf[r, i + 1] = (i + 1) + (running * spare) // u_total

    @kernel_cache.njit(parallel=True, nogil=True)
    def _compiled_escape_tables(logits: Any, ids: Any, coarse: Any, cdf: Any) -> None:  # pragma: no cover - compiled
        rows, vocab = logits.shape
        spare = (1 << ESCAPE_BITS) - vocab
        for r in prange(rows):
            top = -_Z_LIMIT
            for j in range(vocab):
                top = max(top, min(max(logits[r, j], -_Z_LIMIT), _Z_LIMIT))
            weights = np.empty(vocab, dtype=np.int64)
            for j in range(vocab):
                weights[j] = coarse[min(top - min(max(logits[r, j], -_Z_LIMIT), _Z_LIMIT), D_MAX) >> _COARSE_SHIFT] + 1
            for i in range(ids.shape[1]):
                weights[ids[r, i]] = 0
            total = 0
            for j in range(vocab):
                total += weights[j]
            length = 0
            while total >> length:
                length += 1
            shift = max(0, length - WEIGHT_BITS)
            u_total = 0
            for j in range(vocab):
                weights[j] >>= shift
                u_total += weights[j]
            running = 0
            cdf[r, 0] = 0
            for j in range(vocab):
                running += weights[j]
                cdf[r, j + 1] = (j + 1) + (running * spare) // u_total

    COMPILED = True
except ImportError:  # pragma: no cover - numba is a pinned dependency; the torch path gives the same integers
    COMPILED = False


def _exp_entries(step_units: int, count: int) -> list[int]:
    """``round(2**31 · e^(−i · step_units / 2**16))`` for ``i < count``, each computed on its own with
    ``decimal`` at 40 digits (correctly rounded, the same everywhere)."""
    with localcontext(exact_context(40)):
        one = Decimal(1 << WEIGHT_BITS)
        scale = Decimal(1 << Q_BITS)
        return [int((one * (Decimal(-i * step_units) / scale).exp()).to_integral_value()) for i in range(count)]


@functools.cache
def _entries() -> tuple[list[int], list[int], list[int]]:
    hi = _exp_entries(1 << _LO_BITS, (D_MAX >> _LO_BITS) + 1)
    lo = _exp_entries(1, 1 << _LO_BITS)
    coarse = _exp_entries(1 << _COARSE_SHIFT, (D_MAX >> _COARSE_SHIFT) + 1)
    return hi, lo, coarse


@functools.cache
def _tables(device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``HI`` (steps of 2**11 units), ``LO`` (steps of 1 unit) and the escape's ``C`` (steps of 2**6)."""
    hi, lo, coarse = _entries()
    return (torch.tensor(hi, dtype=torch.int64, device=device), torch.tensor(lo, dtype=torch.int64, device=device),
            torch.tensor(coarse, dtype=torch.int64, device=device))


def id_bits(vocab_size: int) -> int:
    return max(1, (vocab_size - 1).bit_length())


def frequency_tables(logits: torch.Tensor, top_k: int, precision_bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids (N, k), cdf (N, k + 2))``: top-k ids in canonical order, and the CDF of k + escape symbols,
    on ``logits``' device (int64 arithmetic only: the same integers on every device)."""
    n_rows, vocab = logits.shape
    if not 1 <= top_k < vocab:
        raise ValueError(f"top_k must lie in [1, {vocab})")
    if top_k + 1 > 1 << precision_bits:
        raise ValueError(f"{top_k + 1} symbols do not fit {precision_bits}-bit frequencies")
    if vocab > 1 << 21:
        raise ValueError("vocabularies above 2**21 ids are not supported")
    device = logits.device
    hi, lo, coarse = _tables(str(device))
    bits = id_bits(vocab)
    if COMPILED and device.type == "cpu" and logits.dtype == torch.int64:
        ids = torch.empty(n_rows, top_k, dtype=torch.int64)
        cdf = torch.empty(n_rows, top_k + 2, dtype=torch.int64)
        dispatch.report("frequencies.compiled_tables", logits, hi, lo, coarse)
        dispatch.launch(_compiled_tables, logits.contiguous().numpy(), bits, hi.numpy(), lo.numpy(),
                              coarse.numpy(), precision_bits, ids.numpy(), cdf.numpy())
        return ids, cdf
    z = logits.clamp(-_Z_LIMIT, _Z_LIMIT)
    top_z = z.amax(dim=1, keepdim=True)
    key = z * (1 << bits) + torch.arange(vocab - 1, -1, -1, dtype=torch.int64, device=device)  # |key| < 2**57
    top = torch.topk(key, top_k, dim=1, sorted=True).values
    ids = (vocab - 1) - (top & ((1 << bits) - 1))
    d_top = (top_z - (top >> bits)).clamp(max=D_MAX)
    top_w = (hi[d_top >> _LO_BITS] * lo[d_top & ((1 << _LO_BITS) - 1)] + (1 << (WEIGHT_BITS - 1))) >> WEIGHT_BITS
    d_all = (top_z - z).clamp_(max=D_MAX).bitwise_right_shift_(_COARSE_SHIFT)
    escape = coarse[d_all].sum(dim=1, keepdim=True) - coarse[d_top >> _COARSE_SHIFT].sum(dim=1, keepdim=True)
    weights = torch.cat([top_w, escape], dim=1)  # total ≤ vocab · 2**31 ≤ 2**52: exact in float64
    total = weights.sum(dim=1, keepdim=True)
    _, exponent = torch.frexp(total.to(torch.float64))  # the bit length of total
    shift = (exponent.to(torch.int64) - WEIGHT_BITS).clamp(min=0)
    u = weights >> shift
    u_total = u.sum(dim=1, keepdim=True)
    n = top_k + 1
    spare = (1 << precision_bits) - n
    cdf = torch.zeros(n_rows, n + 1, dtype=torch.int64, device=device)
    cdf[:, 1:] = torch.arange(1, n + 1, device=device) + (torch.cumsum(u, dim=1) * spare) // u_total  # < 2**32 · 2**31
    return ids, cdf


def token_intervals(ids: torch.Tensor, cdf: torch.Tensor, tokens: torch.Tensor, vocab_size: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row: ``(low, freq)`` of ``tokens[row]``'s symbol and its fallback rank (−1 when in the top-k).

    A token outside the top-k codes as the escape symbol (the last), then as its rank among the
    ``vocab_size − k`` ids not in the top-k, ascending.
    """
    k = ids.shape[1]
    match = ids == tokens[:, None]
    found = match.any(dim=1)
    symbol = torch.where(found, match.to(torch.int64).argmax(dim=1), torch.full_like(tokens, k))
    low = cdf.gather(1, symbol[:, None])[:, 0]
    freq = cdf.gather(1, symbol[:, None] + 1)[:, 0] - low
    rank = tokens - (ids < tokens[:, None]).sum(dim=1)
    return low, freq, torch.where(found, torch.full_like(rank, -1), rank)


def rank_to_token(ids_row: npt.NDArray[np.int64], rank: int) -> int:
    """The id outside ``ids_row`` whose ascending rank among the ids not in the top-k is ``rank``."""
    ordered = np.sort(ids_row)
    skipped = ordered - np.arange(ordered.size)
    return rank + int(np.searchsorted(skipped, rank, side="right"))


def escape_tables(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``cdf (N, vocab + 1)``: after an escape (container version 4), the token's distribution over the
    whole vocabulary in id order, summing to ``2**ESCAPE_BITS``.

    An id outside the row's top-k ``ids`` weighs ``C[d >> 6] + 1`` — the coarse weight its escape
    mass was summed from (plus one, so the row never sums to zero), an id inside it 0; then, as for
    the top-k table, ``s = max(0, bitlength(W) − 31)``, ``u = w >> s`` and
    ``cdf[i] = i + floor((2**32 − vocab) · (u_0 + … + u_{i−1}) / U)``: every id gets ≥ 1 and a top-k
    id exactly 1 (an encoder never codes one there). Version 3 coded the token's rank among the ids
    outside the top-k uniformly, which cost the default model 0.47 % of its code length at top-k
    1,024 (504 escapes in 36,450 tokens of held-out code, 1.2 bits too many each). Only the rows that
    escape need this, so the per-step cost of the top-k tables is unchanged. Int64 only: the same
    integers on every device (on the CPU one compiled loop per row, ``_compiled_escape_tables``).
    """
    n_rows, vocab = logits.shape
    device = logits.device
    coarse = _tables(str(device))[2]
    if COMPILED and device.type == "cpu" and logits.dtype == torch.int64:
        cdf = torch.empty(n_rows, vocab + 1, dtype=torch.int64)
        dispatch.report("frequencies.compiled_escape_tables", logits, ids, coarse)
        dispatch.launch(_compiled_escape_tables, logits.contiguous().numpy(), ids.contiguous().numpy(),
                              coarse.numpy(), cdf.numpy())
        return cdf
    z = logits.clamp(-_Z_LIMIT, _Z_LIMIT)
    d = (z.amax(dim=1, keepdim=True) - z).clamp_(max=D_MAX).bitwise_right_shift_(_COARSE_SHIFT)
    w = coarse[d] + 1  # ≤ 2**31 + 1 each: a total < 2**21 · (2**31 + 1), exact in float64
    w[torch.arange(n_rows, device=device)[:, None], ids] = 0
    _, exponent = torch.frexp(w.sum(dim=1, keepdim=True).to(torch.float64))
    u = w >> (exponent.to(torch.int64) - WEIGHT_BITS).clamp(min=0)  # Σu < 2**31, and Σu ≥ 1
    spare = (1 << ESCAPE_BITS) - vocab
    cdf = torch.zeros(n_rows, vocab + 1, dtype=torch.int64, device=device)
    cdf[:, 1:] = torch.arange(1, vocab + 1, device=device) + (torch.cumsum(u, dim=1) * spare) // u.sum(
        dim=1, keepdim=True)  # < 2**31 · 2**32
    return cdf
