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

Calls are serialised by a lock: numba's default thread pool does not take concurrent launches.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

logger = logging.getLogger("cascade.codec")
_LOCK = threading.Lock()
observers: list[Callable[[str, tuple[torch.Tensor, ...]], None]] = []
"""Called with each kernel's name and operands (``audit.OpAudit`` checks them: dispatch never sees numba)."""
_host = threading.local()


def report(name: str, *tensors: torch.Tensor) -> None:
    """Tell the ``observers`` that kernel ``name`` runs on ``tensors``."""
    for observe in observers:
        observe(name, tensors)


@contextlib.contextmanager
def host_step(name: str, *tensors: torch.Tensor) -> Iterator[None]:
    """A reviewed step of the decision path that runs on the host by design (``model.exact_root``'s
    square roots off the CPU): reported as kernel ``name``; inside it (``on_host``) the audit does not
    hold tensors to the decision path's device."""
    report(name, *tensors)
    _host.depth = getattr(_host, "depth", 0) + 1
    try:
        yield
    finally:
        _host.depth -= 1


def on_host() -> bool:
    return getattr(_host, "depth", 0) > 0

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
    report("cache_products.scores", q, keys, index)
    launch(_scores, q.contiguous().numpy(), keys.numpy(), index.numpy(), span, out.numpy())
    return out


def weighted(p: torch.Tensor, values: torch.Tensor, span: int, cache_rows: torch.Tensor | None = None
             ) -> torch.Tensor:
    """``p (rows, kv_heads, group, span) float64 · values[cache_rows, :, :span] (int32)`` → ``(rows, kv_heads,
    group, D)`` (``cache_rows`` as in ``scores``)."""
    out = torch.empty(*p.shape[:3], values.shape[3], dtype=torch.float64)
    index = _rows(cache_rows, p.shape[0])
    report("cache_products.weighted", p, values, index)
    launch(_weighted, p.contiguous().numpy(), values.numpy(), index.numpy(), span, out.numpy())
    return out


def launch(kernel: Any, *args: Any) -> None:
    """Run ``kernel`` on as many threads as torch uses in this thread. Numba's OpenMP start-up resets
    the calling thread's OpenMP thread count (measured: torch 1 → 2 after the first launch), which
    would undo ``codec_threads`` and the single-threaded loading: the caller's count is put back."""
    threads = torch.get_num_threads()
    with _LOCK:
        numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
        kernel(*args)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
