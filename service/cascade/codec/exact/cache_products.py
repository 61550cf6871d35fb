"""Decode-step attention products read straight from the integer KV cache (CPU, numba).

Why: a decode step reads every cached key and value once. torch can only take a float64 product of
float64 operands, so the int32 cache had to be converted first — written and read again as 8-byte
floats, three times the memory traffic of the product itself, and most of a step's time at real
context lengths. These two loops read the int32 cache directly.

Why the bits are the same: each kernel forms only sums of products of integers — ``q·k`` (both on
their grids, ``|q|, |k| ≤ √(2**53 / head_dim)``) and ``p·v`` (``p ≤ 2**16``, ``|v|`` bounded so that
the longest context stays below 2**53) — so every product and every partial sum is an integer
below 2**53: exact in float64 in any order, vectorised or contracted into FMAs (which is why
reassociation and contraction are allowed here and nowhere else). Everything that rounds (the
scores' grid scale, ``rint``, the exp table, the final division) stays in the torch code of
``model``. The kernels compute what ``torch.bmm`` computes on the converted cache, bit for bit
(tested), and the model falls back to that path where numba is missing or the device is not the CPU.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch

from cascade.codec.exact import dispatch

logger = logging.getLogger("cascade.codec")

try:
    import numba
    from numba import prange

    _EXACT_SUMS: Any = {"reassoc", "contract"}

    @numba.njit(parallel=True, fastmath=_EXACT_SUMS, cache=False, nogil=True)
    def _scores(q: Any, keys: Any, cache_rows: Any, span: int, out: Any) -> None:  # pragma: no cover - compiled
        rows, heads, group, dim = q.shape
        for rh in prange(rows * heads):
            r = rh // heads
            h = rh - r * heads
            c = cache_rows[r]
            for j in range(span):
                for g in range(group):
                    acc = 0.0
                    for d in range(dim):
                        acc += q[r, h, g, d] * keys[c, h, j, d]
                    out[r, h, g, j] = acc

    @numba.njit(parallel=True, fastmath=_EXACT_SUMS, cache=False, nogil=True)
    def _weighted(p: Any, values: Any, cache_rows: Any, span: int, out: Any) -> None:  # pragma: no cover - compiled
        rows, heads, group, dim = out.shape
        for rh in prange(rows * heads):
            r = rh // heads
            h = rh - r * heads
            c = cache_rows[r]
            for g in range(group):
                for d in range(dim):
                    out[r, h, g, d] = 0.0
            for j in range(span):
                for g in range(group):
                    weight = p[r, h, g, j]
                    for d in range(dim):
                        out[r, h, g, d] += weight * values[c, h, j, d]

    AVAILABLE = True
except ImportError:  # pragma: no cover - numba is a pinned dependency; the torch path stays correct
    AVAILABLE = False


def usable(device: torch.device, cache_dtype: torch.dtype) -> bool:
    """Whether the kernels serve this model: numba present and working here, CPU tensors, an int32 cache."""
    return device.type == "cpu" and cache_dtype == torch.int32 and _compiles()


@functools.cache
def _compiles() -> bool:
    """Compile and check both kernels once (at model load, not inside a request): a host where numba
    cannot build them keeps torch's kernels — the same integers — instead of failing decode steps."""
    if not AVAILABLE:
        return False
    try:
        q = torch.arange(24, dtype=torch.float64).view(1, 2, 3, 4) - 11
        cache = (torch.arange(40, dtype=torch.int32).view(1, 2, 5, 4) - 19).contiguous()
        p = scores(q, cache, 4)
        if not torch.equal(p, q @ cache[:, :, :4].to(torch.float64).transpose(-1, -2)):
            return False
        return torch.equal(weighted(p, cache, 4), p @ cache[:, :, :4].to(torch.float64))
    except Exception as exc:  # numba's errors are many types; any of them means "not here"
        logger.warning("integer-cache attention kernels unavailable (%s: %s): torch's kernels are used",
                       type(exc).__name__, exc)
        return False


def _rows(cache_rows: torch.Tensor | None, rows: int) -> torch.Tensor:
    return torch.arange(rows, dtype=torch.int64) if cache_rows is None else cache_rows.to(torch.int64).contiguous()


def scores(q: torch.Tensor, keys: torch.Tensor, span: int, cache_rows: torch.Tensor | None = None) -> torch.Tensor:
    """``q (rows, kv_heads, group, D) float64 · keys[cache_rows, :, :span] (int32)ᵀ`` → ``(rows, kv_heads, group,
    span)``; query row ``r`` reads cache row ``cache_rows[r]`` (default ``r``: several queries may share one
    row, as a verify pass's positions of one lane do)."""
    out = torch.empty(*q.shape[:3], span, dtype=torch.float64)
    index = _rows(cache_rows, q.shape[0])
    dispatch.report("cache_products.scores", q, keys, index)
    dispatch.launch(_scores, q.contiguous().numpy(), keys.numpy(), index.numpy(), span, out.numpy())
    return out


def weighted(p: torch.Tensor, values: torch.Tensor, span: int, cache_rows: torch.Tensor | None = None
             ) -> torch.Tensor:
    """``p (rows, kv_heads, group, span) float64 · values[cache_rows, :, :span] (int32)`` → ``(rows, kv_heads,
    group, D)`` (``cache_rows`` as in ``scores``)."""
    out = torch.empty(*p.shape[:3], values.shape[3], dtype=torch.float64)
    index = _rows(cache_rows, p.shape[0])
    dispatch.report("cache_products.weighted", p, values, index)
    dispatch.launch(_weighted, p.contiguous().numpy(), values.numpy(), index.numpy(), span, out.numpy())
    return out
