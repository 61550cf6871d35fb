"""The exact model's elementwise chains as one compiled loop each (CPU, numba): same operations, same order.

Why: between its GEMMs a layer runs about a hundred small torch operations (RMSNorm, quantisation,
RoPE, the attention weights, SiLU, the residual adds), each a separate pass over memory and a
separate dispatch. On a CPU a 32-row decode step spent most of its time there, and one core idled
while Python launched them. Each function here does one such chain for a whole batch of rows in a
single parallel loop.

Why the bits are the same: every kernel performs, per element, the very IEEE-754 binary64
operations the torch code of ``model`` performs, in the same order, each correctly rounded
(``+ − × ÷ √``, ``min``/``max``, the ``1.5·2**52`` rounding trick), and table lookups at the same
integer indices. They are compiled *without* fast-math: no reassociation, no reciprocal, no
contraction into FMA — :func:`strict` checks the generated machine code for fused multiply-adds
and refuses the kernels where it finds one. The only reductions are maxima (exact) and sums of
integers below 2**53 (exact in any order; the attention products ``_integer_scores`` and
``_integer_weighted`` are compiled with reassociation for that reason, still without contraction).
Tests compare every kernel with the torch code bit for bit, and the recorded ``exact-llama-1``
digests hold on this path.
"""

from __future__ import annotations

import functools
import logging
import re
import types
from typing import Any

import numpy as np
import torch

from cascade.codec.exact import dispatch, kernel_cache, root
from cascade.codec.exact.grid import (
    ACT8,
    ACT16,
    BYTE,
    BYTE_TERMS,
    DIGIT,
    MASKED,
    QK_UNIT,
    RINT_LIMIT,
    RINT_MAGIC,
    SIG_UNIT,
    V_UNIT,
)

logger = logging.getLogger("cascade.codec")
_FMA = re.compile(r"\bv?f(n)?m(add|sub)\w*|\bfmla\b|\bfmls\b", re.IGNORECASE)


def _serially(rows: int) -> bool:
    """Whether a launch over ``rows`` runs its row loop serially: one row has nothing to split (``_RowKernel``)."""
    return rows < 2


def _split_heads(rows: int, kv_heads: int) -> bool:
    """Whether ``_attend_cached`` makes each query head a task (too few rows × kv heads for the threads)."""
    return rows * kv_heads < 2 * torch.get_num_threads()


try:
    import numba
    from numba import prange

    from cascade.codec.exact.pair_dot import pair_dot

    _STRICT: dict[str, Any] = {"parallel": True, "nogil": True, "error_model": "numpy", "fastmath": False}

    class _RowKernel:
        """A strict kernel whose ``prange`` runs over rows, compiled twice: in parallel, and serially for a
        launch of one row, which has nothing to split. A parallel launch wakes the thread pool and waits
        for it (measured 3.1 µs against 1.7 µs serially on a quiet machine, 51 µs against 3.6 µs beside a
        running test suite), and a one-row decode step launches ~150 of them. (Two or more rows stay
        parallel: serial launches of 2–4 rows made those passes ~5 % slower.) Both variants are the same
        Python function, the same operations per element in the same order (``prange`` only distributes
        rows), so the bits cannot differ. The serial variant is a copy of the function under its own name:
        numba's cache keys code by function, not by the options it was compiled with."""

        def __init__(self, function: Any) -> None:
            self.__name__ = function.__name__
            self.parallel = kernel_cache.njit(**_STRICT)(function)
            serial = types.FunctionType(function.__code__, function.__globals__, f"{function.__name__}_serial",
                                        function.__defaults__, function.__closure__)
            serial.__qualname__ = f"{function.__qualname__}_serial"
            self.serial = kernel_cache.njit(**{**_STRICT, "parallel": False})(serial)

        @property
        def variants(self) -> tuple[Any, Any]:
            return self.parallel, self.serial

        def __call__(self, rows: int, *args: Any) -> None:
            """Run on ``args``, whose ``rows`` the parallel variant would split."""
            if _serially(rows):
                self.serial(*args)
            else:
                dispatch.launch(self.parallel, *args)

    @numba.njit(inline="always", error_model="numpy", fastmath=False)
    def _rint(v: float) -> float:  # pragma: no cover - compiled
        v = min(max(v, -RINT_LIMIT), RINT_LIMIT)
        return (v + RINT_MAGIC) - RINT_MAGIC

    @numba.njit(inline="always", error_model="numpy", fastmath=False)
    def _quantize_row(z: Any, act: float, m: Any) -> float:  # pragma: no cover - compiled
        amax = 0.0
        for j in range(z.shape[0]):
            a = abs(z[j])
            if a > amax:
                amax = a
        step = (amax if amax > 0.0 else 1.0) / act
        for j in range(z.shape[0]):
            m[j] = np.int8((z[j] / step + RINT_MAGIC) - RINT_MAGIC)
        return step

    @numba.njit(inline="always", error_model="numpy", fastmath=False)
    def _mean_square(x: Any, eps: float) -> float:  # pragma: no cover - compiled
        n = x.shape[0]
        amax = 0.0
        for j in range(n):
            a = abs(x[j])
            if a > amax:
                amax = a
        step = (amax if amax > 0.0 else 1.0) / ACT16
        squares = 0.0
        for j in range(n):
            xi = _rint(x[j] / step)
            squares += xi * xi
        return squares / float(n) * (step * step) + eps

    @_RowKernel
    def _mean_squares(x: Any, eps: float, out: Any) -> None:  # pragma: no cover - compiled
        for r in prange(x.shape[0]):
            out[r] = _mean_square(x[r], eps)

    @numba.njit(inline="always", error_model="numpy", fastmath=False)
    def _linear_out(acc: Any, step: float, scale: Any, bias: Any, j: int) -> float:  # pragma: no cover
        y = acc[j] * (step * scale[j])
        return y + bias[j] if bias.shape[0] else y

    @_RowKernel
    def _norm_quantize(x: Any, roots: Any, gain: Any, z: Any, m: Any, steps: Any) -> None:  # pragma: no cover
        for r in prange(x.shape[0]):
            for j in range(x.shape[1]):
                z[r, j] = x[r, j] / roots[r] * gain[j]
            steps[r] = _quantize_row(z[r], ACT8, m[r])

    @_RowKernel
    def _residual(x: Any, acc: Any, steps: Any, scale: Any, bias: Any, eps: float, out: Any, squares: Any
                  ) -> None:  # pragma: no cover - compiled
        for r in prange(x.shape[0]):
            for j in range(x.shape[1]):
                out[r, j] = x[r, j] + _linear_out(acc[r], steps[r], scale, bias, j)
            squares[r] = _mean_square(out[r], eps)

    @_RowKernel
    def _silu_quantize(acc: Any, steps: Any, scale: Any, bias: Any, table: Any, z: Any, m: Any,
                       next_steps: Any) -> None:  # pragma: no cover - compiled
        inter = z.shape[1]
        half = float((table.shape[0] - 1) // 2)
        for r in prange(acc.shape[0]):
            for j in range(inter):
                g = _linear_out(acc[r], steps[r], scale, bias, j)
                u = _linear_out(acc[r], steps[r], scale, bias, inter + j)
                index = min(max(_rint(g * SIG_UNIT), -half), half)
                z[r, j] = g * table[int(index) + int(half)] * u
            next_steps[r] = _quantize_row(z[r], ACT8, m[r])

    @_RowKernel
    def _qkv(acc: Any, steps: Any, scale: Any, bias: Any, positions: Any, cos: Any, sin: Any, qk_limit: float,
             v_limit: float, q: Any, k: Any, v: Any) -> None:  # pragma: no cover - compiled
        heads, dim = q.shape[1], q.shape[2]
        kv_heads = k.shape[1]
        half = dim // 2
        for r in prange(acc.shape[0]):
            p = positions[r]
            for h in range(heads + kv_heads):
                base = h * dim
                for i in range(half):
                    x1 = _linear_out(acc[r], steps[r], scale, bias, base + i)
                    x2 = _linear_out(acc[r], steps[r], scale, bias, base + half + i)
                    c = cos[p, i]
                    s = sin[p, i]
                    lo = min(max(_rint((x1 * c - x2 * s) * QK_UNIT), -qk_limit), qk_limit)
                    hi = min(max(_rint((x2 * c + x1 * s) * QK_UNIT), -qk_limit), qk_limit)
                    if h < heads:
                        q[r, h, i] = lo
                        q[r, h, half + i] = hi
                    else:
                        k[r, h - heads, i] = lo
                        k[r, h - heads, half + i] = hi
            base = (heads + kv_heads) * dim
            for h in range(kv_heads):
                for i in range(dim):
                    value = _linear_out(acc[r], steps[r], scale, bias, base + h * dim + i)
                    v[r, h, i] = min(max(_rint(value * V_UNIT), -v_limit), v_limit)

    @kernel_cache.njit(fastmath={"reassoc"}, error_model="numpy", nogil=True)
    def _integer_scores(q: Any, keys: Any, out: Any) -> None:  # pragma: no cover - compiled
        """``out[g, j] = q[g]·keys[j]``: sums of products of integers, each partial sum below 2**53 (exact in
        any order, so reassociation is allowed here and in ``_integer_weighted`` only)."""
        for j in range(keys.shape[0]):
            for g in range(q.shape[0]):
                acc = 0.0
                for i in range(q.shape[1]):
                    acc += q[g, i] * keys[j, i]
                out[g, j] = acc

    @kernel_cache.njit(fastmath={"reassoc"}, error_model="numpy", nogil=True)
    def _integer_weighted(p: Any, values: Any, out: Any) -> None:  # pragma: no cover - compiled
        """``out[g] = Σ_j p[g, j]·values[j]``: integer weights ≤ 2**16 times bounded integers, below 2**53."""
        for g in range(out.shape[0]):
            for i in range(out.shape[1]):
                out[g, i] = 0.0
        for j in range(values.shape[0]):
            for g in range(p.shape[0]):
                w = p[g, j]
                for i in range(values.shape[1]):
                    out[g, i] += w * values[j, i]

    @kernel_cache.njit(**_STRICT)
    def _attend_cached(q: Any, k: Any, v: Any, cache_rows: Any, positions: Any, keys: Any, values: Any,
                       to_grid: float, table: Any, unit: float, split: bool, z: Any, m: Any, steps: Any
                       ) -> None:  # pragma: no cover - compiled
        rows, heads, dim = q.shape
        kv_heads = k.shape[1]
        group = heads // kv_heads
        last = float(table.shape[0] - 1)
        for r in prange(rows):
            c = cache_rows[r]
            p = positions[r]
            for h in range(kv_heads):
                for i in range(dim):
                    keys[c, h, p, i] = k[r, h, i]
                    values[c, h, p, i] = v[r, h, i]
        parts = group if split else 1
        width = group // parts
        for task in prange(rows * kv_heads * parts):
            r = task // (kv_heads * parts)
            kv = (task // parts) % kv_heads
            first = kv * group + (task % parts) * width
            c = cache_rows[r]
            n = positions[r] + 1
            weights = np.empty((width, n))
            _integer_scores(q[r, first:first + width], keys[c, kv, :n], weights)
            totals = np.zeros(width)
            for g in range(width):
                top = MASKED
                for j in range(n):
                    if weights[g, j] > top:
                        top = weights[g, j]
                for j in range(n):
                    index = (min((top - weights[g, j]) * to_grid, last) + RINT_MAGIC) - RINT_MAGIC
                    weights[g, j] = table[int(index)]
                    totals[g] += weights[g, j]
            weighted = np.empty((width, dim))
            _integer_weighted(weights, values[c, kv, :n], weighted)
            out = z[r, first * dim:(first + width) * dim]
            for g in range(width):
                denominator = totals[g] * unit
                for i in range(dim):
                    out[g * dim + i] = weighted[g, i] / denominator
        for r in prange(rows):
            steps[r] = _quantize_row(z[r], ACT8, m[r])

    @numba.njit(inline="always", error_model="numpy", fastmath=False)
    def _output_row(x: Any, root: float, gain: Any, z: Any) -> float:  # pragma: no cover - compiled
        """``z = x ÷ root × gain`` for one row, and the step of its ±32,767 grid (the output layer's input)."""
        amax = 0.0
        for j in range(x.shape[0]):
            z[j] = x[j] / root * gain[j]
            a = abs(z[j])
            if a > amax:
                amax = a
        return (amax if amax > 0.0 else 1.0) / ACT16

    @_RowKernel
    def _norm_digits(x: Any, roots: Any, gain: Any, z: Any, digits: Any, steps: Any) -> None:  # pragma: no cover
        rows, n = x.shape
        for r in prange(rows):
            step = _output_row(x[r], roots[r], gain, z[r])
            steps[r] = step
            for j in range(n):
                m = (z[r, j] / step + RINT_MAGIC) - RINT_MAGIC
                t = (m * DIGIT + RINT_MAGIC) - RINT_MAGIC
                top = (t * DIGIT + RINT_MAGIC) - RINT_MAGIC
                digits[r, j] = np.int8(top)
                digits[rows + r, j] = np.int8(t - top * 128.0)
                digits[2 * rows + r, j] = np.int8(m - t * 128.0)

    @_RowKernel
    def _norm_bytes(x: Any, roots: Any, gain: Any, z: Any, digits: Any, steps: Any, fix_index: Any, fix_value: Any,
                    fix_count: Any) -> None:  # pragma: no cover - compiled
        rows, n = x.shape
        for r in prange(rows):
            step = _output_row(x[r], roots[r], gain, z[r])
            steps[r] = step
            count = 0
            for j in range(n):
                m = (z[r, j] / step + RINT_MAGIC) - RINT_MAGIC
                high = min(np.floor((m + 128.0) * BYTE), 127.0)
                low = m - high * 256.0
                if low > 127.0:
                    fix_index[r, count] = j
                    fix_value[r, count] = np.int64(low - 127.0)
                    count += 1
                    low = 127.0
                digits[r, j] = np.int8(high)
                digits[rows + r, j] = np.int8(low)
            fix_count[r] = count

    @kernel_cache.njit(parallel=True, nogil=True, error_model="numpy", fastmath=False)
    def _byte_product(digits: Any, weight_rows: Any, fix_index: Any, fix_value: Any, fix_count: Any,
                      out: Any) -> None:  # pragma: no cover - compiled
        rows = out.shape[0]
        wide = digits.astype(np.int16)
        for j in prange(weight_rows.shape[0]):
            w = weight_rows[j]
            for r in range(rows):
                total = np.int64(pair_dot(wide[r], w)) * 256 + np.int64(pair_dot(wide[rows + r], w))
                for f in range(fix_count[r]):
                    total += fix_value[r, f] * np.int64(w[fix_index[r, f]])
                out[r, j] = float(total)

    @numba.njit(inline="always", error_model="numpy", fastmath=False)
    def _logit(total: float, step: float, scale: float) -> Any:  # pragma: no cover - compiled
        """An integer logit from the output layer's exact integer product: × (step·scale), rint."""
        return np.int64(_rint(total * (step * scale)))

    @_RowKernel
    def _total_logits(totals: Any, steps: Any, scale: Any, out: Any) -> None:  # pragma: no cover - compiled
        rows, vocab = out.shape
        for r in prange(rows):
            for j in range(vocab):
                out[r, j] = _logit(totals[r, j], steps[r], scale[j])

    @_RowKernel
    def _digit_logits(products: Any, steps: Any, scale: Any, out: Any) -> None:  # pragma: no cover - compiled
        rows, vocab = out.shape
        for r in prange(rows):
            for j in range(vocab):
                total = ((np.int64(products[r, j]) * 128 + np.int64(products[rows + r, j])) * 128
                         + np.int64(products[2 * rows + r, j]))
                out[r, j] = _logit(float(total), steps[r], scale[j])

    @kernel_cache.njit(parallel=True, nogil=True, error_model="numpy", fastmath=False)
    def _int8_product(m: Any, weight_rows: Any, out: Any) -> None:  # pragma: no cover - compiled
        """The activations are widened to int16 once, so each multiply-add sign-extends only the weights: a
        product of two or more rows is bound by arithmetic on AVX2 (a weight row is in cache for the next
        activation row), and this saves one of the four instructions per 16 terms (a 2-row product of
        SmolLM2's layers 9.6 → 7.7 ms on an AVX2 Zen 3; one row reads memory either way). Each sum is
        ``pair_dot``'s, at full vector width."""
        wide = m.astype(np.int16)
        for j in prange(weight_rows.shape[0]):
            w = weight_rows[j]
            for r in range(m.shape[0]):
                out[r, j] = pair_dot(wide[r], w)

    # The row kernels `_layer` calls (`_compiled_layer` binds each variant's).
    _layer_norm_quantize, _layer_qkv, _layer_residual, _layer_silu_quantize = (
        kernel.parallel for kernel in (_norm_quantize, _qkv, _residual, _silu_quantize))

    def _layer(x: Any, squares: Any, positions: Any, cache_rows: Any, keys: Any, values: Any, attn_norm: Any,
               qkv_rows: Any, qkv_scale: Any, qkv_bias: Any, o_rows: Any, o_scale: Any, o_bias: Any, mlp_norm: Any,
               gate_up_rows: Any, gate_up_scale: Any, gate_up_bias: Any, down_rows: Any, down_scale: Any,
               down_bias: Any, cos: Any, sin: Any, att_table: Any, sig_table: Any, heads: int, qk_limit: float,
               v_limit: float, eps: float, to_grid: float, unit: float, split: bool
               ) -> tuple[Any, Any]:  # pragma: no cover - compiled
        """The body of ``_compiled_layer``'s kernels (never run as Python)."""
        rows, hidden = x.shape
        kv_heads, dim = keys.shape[1], keys.shape[3]
        inter = gate_up_rows.shape[0] // 2
        roots = np.sqrt(squares)
        z = np.empty((rows, hidden))
        m = np.empty((rows, hidden), dtype=np.int8)
        steps = np.empty(rows)
        _layer_norm_quantize(x, roots, attn_norm, z, m, steps)
        acc = np.empty((rows, qkv_rows.shape[0]), dtype=np.int32)
        _int8_product(m, qkv_rows, acc)
        q = np.empty((rows, heads, dim))
        k = np.empty((rows, kv_heads, dim))
        v = np.empty((rows, kv_heads, dim))
        _layer_qkv(acc, steps, qkv_scale, qkv_bias, positions, cos, sin, qk_limit, v_limit, q, k, v)
        attended = np.empty((rows, heads * dim), dtype=np.int8)
        attended_steps = np.empty(rows)
        _attend_cached(q, k, v, cache_rows, positions, keys, values, to_grid, att_table, unit, split,
                       np.empty((rows, heads * dim)), attended, attended_steps)
        acc = np.empty((rows, o_rows.shape[0]), dtype=np.int32)
        _int8_product(attended, o_rows, acc)
        mid = np.empty((rows, hidden))
        mid_squares = np.empty(rows)
        _layer_residual(x, acc, attended_steps, o_scale, o_bias, eps, mid, mid_squares)
        roots = np.sqrt(mid_squares)
        _layer_norm_quantize(mid, roots, mlp_norm, z, m, steps)
        acc = np.empty((rows, gate_up_rows.shape[0]), dtype=np.int32)
        _int8_product(m, gate_up_rows, acc)
        gated = np.empty((rows, inter), dtype=np.int8)
        gated_steps = np.empty(rows)
        _layer_silu_quantize(acc, steps, gate_up_scale, gate_up_bias, sig_table, np.empty((rows, inter)), gated,
                             gated_steps)
        acc = np.empty((rows, down_rows.shape[0]), dtype=np.int32)
        _int8_product(gated, down_rows, acc)
        out = np.empty((rows, hidden))
        out_squares = np.empty(rows)
        _layer_residual(mid, acc, gated_steps, down_scale, down_bias, eps, out, out_squares)
        return out, out_squares

    def _compiled_layer(variant: str) -> Any:
        """``_layer`` on the row kernels' ``variant`` ("parallel", or "serial" for one row), compiled: one
        decoder layer over the cache (``kernels.Kernels.layer``'s seven steps) calling the row kernels,
        ``_int8_product`` and ``_attend_cached`` in the step-by-step order, on buffers it allocates itself:
        the same launches without a Python call, conversion or allocation between them. Each variant is
        the same code under its own name, its row kernels bound as globals (a closure over them could not
        be cached: numba's key hashes a closure's cells, and a dispatcher's hash differs in every process)."""
        scope = {**globals(), **{f"_layer_{kernel.__name__.lstrip('_')}": getattr(kernel, variant)
                                 for kernel in (_norm_quantize, _qkv, _residual, _silu_quantize)}}
        function = types.FunctionType(_layer.__code__, scope, f"_layer_{variant}")
        function.__qualname__ = f"_layer_{variant}"
        return kernel_cache.njit(nogil=True, error_model="numpy", fastmath=False)(function)

    _cached_layer = (_compiled_layer("parallel"), _compiled_layer("serial"))
    """A layer over the cache on the row kernels' parallel variants, and on their serial ones (one row)."""

    AVAILABLE = True
except ImportError:  # pragma: no cover - numba is a pinned dependency; the torch path stays correct
    AVAILABLE = False


Array = Any
"""A kernel operand: a numpy array, or a CPU tensor (taken as a view). Kernels return numpy arrays: the
compiled kernel set keeps its activations as arrays between launches (``kernels.CompiledKernels``), so a
decode step converts nothing but a GEMM's operand and result (a one-row step launches ~200 kernels, and
each conversion or torch allocation cost a sizeable share of a launch's own overhead)."""


def array(t: Array) -> Any:
    """``t`` as a C-contiguous numpy array (a view of a CPU tensor: the compiled signature is the warmed-up one)."""
    if isinstance(t, np.ndarray):
        return t if t.flags.c_contiguous else np.ascontiguousarray(t)
    return t.contiguous().numpy()


def _report(name: str, *operands: Array) -> None:
    """``dispatch.report`` with tensors (the audit's currency), built only when someone observes."""
    if dispatch.observers:
        dispatch.report(name, *(torch.from_numpy(o) if isinstance(o, np.ndarray) else o for o in operands))


def bias_array(bias: Array | None) -> Any:
    """A linear layer's bias as the kernels take it (an empty array for none)."""
    return _NO_BIAS if bias is None else array(bias)


_NO_BIAS = np.empty(0, dtype=np.float64)


def mean_squares(x: Array, eps: float) -> Any:
    """RMSNorm's ``mean_square + eps`` of each row of ``x``."""
    x = array(x)
    squares = np.empty(x.shape[0])
    _report("fused.mean_squares", x)
    _mean_squares(x.shape[0], x, float(eps), squares)
    return squares


def _roots(x: Any, eps: float, squares: Any | None = None) -> Any:
    """RMSNorm's per-row roots of ``mean_square + eps`` (``squares``, when ``residual`` computed them).

    The square root is not a kernel's: ``root.root`` decides which root the model computes with
    (docs/architecture.md, "The square root")."""
    return root.root(mean_squares(x, eps) if squares is None else squares)


def norm_quantize(x: Array, gain: Array, eps: float, squares: Array | None = None) -> tuple[Any, Any]:
    """``quantize(rms_norm(x, gain, eps))`` → int8 activations and their per-row step (``squares``:
    the rows' ``mean_square + eps`` when ``residual`` already computed them; the roots: ``_roots``)."""
    x, gain = array(x), array(gain)
    rows, n = x.shape
    roots = _roots(x, eps, None if squares is None else array(squares))
    m = np.empty((rows, n), dtype=np.int8)
    steps = np.empty(rows)
    _report("fused.norm_quantize", x, roots, gain)
    _norm_quantize(rows, x, roots, gain, np.empty((rows, n)), m, steps)
    return m, steps


def residual(x: Array, acc: Array, steps: Array, scale: Array, bias: Array | None, eps: float) -> tuple[Any, Any]:
    """``x + linear_output(acc)``, and the sum's rows' ``mean_square + eps`` for the next RMSNorm."""
    x, acc, steps, scale = array(x), array(acc), array(steps), array(scale)
    out = np.empty(x.shape)
    squares = np.empty(x.shape[0])
    _report("fused.residual", x, acc, steps, scale)
    _residual(x.shape[0], x, acc, steps, scale, bias_array(bias), float(eps), out, squares)
    return out, squares


def silu_quantize(acc: Array, steps: Array, scale: Array, bias: Array | None, table: Array) -> tuple[Any, Any]:
    """``quantize(silu(gate) · up)`` from the stacked gate/up GEMM's integer output."""
    acc, steps, scale, table = array(acc), array(steps), array(scale), array(table)
    rows, inter = acc.shape[0], acc.shape[1] // 2
    m = np.empty((rows, inter), dtype=np.int8)
    next_steps = np.empty(rows)
    _report("fused.silu_quantize", acc, steps, scale, table)
    _silu_quantize(rows, acc, steps, scale, bias_array(bias), table, np.empty((rows, inter)), m, next_steps)
    return m, next_steps


def qkv(acc: Array, steps: Array, scale: Array, bias: Array | None, positions: Array, cos: Array, sin: Array,
        heads: int, kv_heads: int, dim: int, qk_limit: float, v_limit: float) -> tuple[Any, Any, Any]:
    """Queries and keys (RoPE, on their grid) and values (on theirs) from the stacked q/k/v GEMM."""
    acc, steps, scale, positions, cos, sin = (array(a) for a in (acc, steps, scale, positions, cos, sin))
    rows = acc.shape[0]
    q = np.empty((rows, heads, dim))
    k = np.empty((rows, kv_heads, dim))
    v = np.empty((rows, kv_heads, dim))
    _report("fused.qkv", acc, steps, scale, positions, cos, sin)
    _qkv(rows, acc, steps, scale, bias_array(bias), positions, cos, sin, float(qk_limit), float(v_limit), q, k, v)
    return q, k, v


def attend_cached(q: Array, k: Array, v: Array, keys: Array, values: Array, cache_rows: Array, positions: Array,
                  to_grid: float, table: Array, unit: float) -> tuple[Any, Any]:
    """Decode and verify attention on the int32 cache, as ``kernels.TorchKernels.attend_cached`` computes it:
    query row ``r``'s key and value integers go to cache row ``cache_rows[r]`` at ``positions[r]`` (every
    query's before any query attends: a verify pass writes several positions of one row), then each query
    head attends to its row's positions ``≤ positions[r]`` and the heads' outputs go onto the ±127 grid.

    Why the bits are the torch set's: ``q·k`` (both on their grids, ``|q|, |k| ≤ √(2**53 / head_dim)``)
    and ``p·v`` (``p ≤ 2**16``, ``|v|`` bounded so that the longest context stays below 2**53) are
    sums of products of integers whose every partial sum is an integer below 2**53, exact in any
    order: ``_integer_scores`` and ``_integer_weighted`` alone are compiled with reassociation (so the
    sums vectorise), never with contraction, so no fused multiply-add appears anywhere and the machine
    code check holds for the whole kernel. Positions past a query's are left out instead of weighing
    ``0`` (adding ``+0.0`` changes no sum). Everything that rounds — the scores' grid scale, ``rint``,
    the exp table, the division, the grid — is the torch set's operations in its order. One launch per layer
    instead of five: a one-row decode step is mostly launches. A parallel task is one row's kv head, whose
    query heads share each cached key and value it reads; with fewer of those than twice the threads (a step
    of one or two rows) each query head is a task of its own, so both cores work."""
    q, k, v, keys, values, cache_rows, positions, table = (
        array(a) for a in (q, k, v, keys, values, cache_rows, positions, table))
    rows, heads, dim = q.shape
    m = np.empty((rows, heads * dim), dtype=np.int8)
    steps = np.empty(rows)
    _report("fused.attend_cached", q, k, v, keys, values, cache_rows, positions, table)
    dispatch.launch(_attend_cached, q, k, v, cache_rows, positions, keys, values, float(to_grid), table, float(unit),
                    _split_heads(rows, k.shape[1]), np.empty((rows, heads * dim)), m, steps)
    return m, steps


def norm_digits(x: Array, gain: Array, eps: float) -> tuple[Any, Any]:
    """The output layer's input: RMSNorm, the ±32,767 grid, and its three int8 digits ``a·2**14 + b·2**7 + c``
    stacked as ``(3·rows, n)`` (``ops.digit_product``'s operand), and the per-row steps."""
    x, gain = array(x), array(gain)
    rows, n = x.shape
    roots = _roots(x, eps)
    digits = np.empty((3 * rows, n), dtype=np.int8)
    steps = np.empty(rows)
    _report("fused.norm_digits", x, roots, gain)
    _norm_digits(rows, x, roots, gain, np.empty((rows, n)), digits, steps)
    return digits, steps


def norm_bytes(x: Array, gain: Array, eps: float) -> tuple[Any, Any, Any, Any, Any]:
    """The output layer's input for ``byte_product``: RMSNorm and the ±32,767 grid, as ``norm_digits``, each
    integer ``m`` written as two int8 digits ``h·2**8 + l`` (``h = min(⌊(m + 128)·2**-8⌋, 127)``, stacked as
    ``(2·rows, n)``) plus, where ``l`` would pass 127 (only ``m ≥ 32,640``: at least a row's largest
    element when it is positive), ``l = 127`` and a correction ``m − h·2**8 − 127`` (1…128) at that index.
    Returns ``(digits, steps, fix_index, fix_value, fix_count)``."""
    x, gain = array(x), array(gain)
    rows, n = x.shape
    roots = _roots(x, eps)
    digits = np.empty((2 * rows, n), dtype=np.int8)
    steps = np.empty(rows)
    fix_index = np.zeros((rows, n), dtype=np.int64)
    fix_value = np.zeros((rows, n), dtype=np.int64)
    fix_count = np.empty(rows, dtype=np.int64)
    _report("fused.norm_bytes", x, roots, gain)
    _norm_bytes(rows, x, roots, gain, np.empty((rows, n)), digits, steps, fix_index, fix_value, fix_count)
    return digits, steps, fix_index, fix_value, fix_count


def byte_product(digits: Array, fix_index: Array, fix_value: Array, fix_count: Array, weight_rows: Array) -> Any:
    """The output layer's exact integer products (float64, ``(rows, vocab)``) of ``norm_bytes``'s rows:
    ``Σ m·w = 2**8·Σ h·w + Σ l·w + Σ correction·w``, one streamed pass over the weights, two int8 rows per
    hidden row (three digit rows cost 1.30 ms on SmolLM2's head, these 0.98 ms).

    Why exact on every machine: integer products summed as integers, in any order and instruction set;
    each digit sum is below 2**31 (``BYTE_TERMS``, checked here) and the total below 2**53 (|m·w| ≤
    32,767·127 a term), so the float64 total is the very value ``(a·128 + b)·128 + c`` that the GEMM
    path recombines from three digits' products (``ops.digit_product``)."""
    digits, weight_rows = array(digits), array(weight_rows)
    if weight_rows.shape[1] > BYTE_TERMS:
        raise ValueError(f"an output layer over {weight_rows.shape[1]} > {BYTE_TERMS} terms: digit sums may overflow")
    fix_index, fix_value, fix_count = array(fix_index), array(fix_value), array(fix_count)
    out = np.empty((digits.shape[0] // 2, weight_rows.shape[0]))
    _report("fused.byte_product", digits, weight_rows, fix_index, fix_value, fix_count)
    dispatch.launch(_byte_product, digits, weight_rows, fix_index, fix_value, fix_count, out)
    return out


def total_logits(totals: Array, steps: Array, scale: Array) -> Any:
    """Integer logits (int64) from the output layer's exact integer products (float64, below 2**53: streamed
    by ``byte_product`` or recombined from the GEMM's digit products): × (step·scale), rint, as the torch
    path's ``QuantLinear.output``."""
    totals, steps, scale = array(totals), array(steps), array(scale)
    out = np.empty(totals.shape, dtype=np.int64)
    _report("fused.total_logits", totals, steps, scale)
    _total_logits(out.shape[0], totals, steps, scale, out)
    return out


def digit_logits(products: Array, steps: Array, scale: Array) -> Any:
    """``total_logits`` of the int8 GEMM's int32 products of ``norm_digits``'s three digit rows ``(3·rows,
    vocab)``, recombined in the same pass: ``(a·128 + b)·128 + c`` in int64 is the float64 total that
    ``ops.digit_product`` recombines (every partial value an integer below 2**53, so exactly), never written.
    Why: torch's elementwise recombination over the rows × vocabulary totals was ~8 % of a compression
    chunk on pycoder-23m (1,024 rows: four passes over 64 MB)."""
    products, steps, scale = array(products), array(steps), array(scale)
    rows = products.shape[0] // 3
    out = np.empty((rows, products.shape[1]), dtype=np.int64)
    _report("fused.digit_logits", products, steps, scale)
    _digit_logits(rows, products, steps, scale, out)
    return out


def cached_layer(x: Array, squares: Array, positions: Array, cache_rows: Array, keys: Array, values: Array,
                 layer: tuple[Any, ...], cos: Array, sin: Array, att_table: Array, sig_table: Array, heads: int,
                 qk_limit: float, v_limit: float, eps: float, to_grid: float, unit: float) -> tuple[Any, Any]:
    """One decoder layer of a few cached rows in one launch (``kernels.CompiledKernels.layer``): ``x`` and its
    rows' ``mean_square + eps`` → the layer's output and its own. ``layer``: the layer's constants as arrays
    (``kernels.CompiledKernels._layer_arrays``: attention gain, q/k/v rows, scale, bias, output projection's,
    MLP gain, gate/up's, down's). Every product streams (``int8_product``: at most ``streamed_rows`` rows).

    Why: a one-row decode step made ~300 launches from Python, and each launch's Python call, operand
    conversions and allocations cost more than most of the kernels themselves (one launch per layer: a
    one-row SmolLM2 pass with its logits and tables 10.9 → 9.7 ms). Why the same bits: the compiled function
    calls the very kernels the step-by-step layer calls, on the same operands in the same order; the root
    is IEEE's ``sqrt``, correctly rounded, as ``root.root``'s.
    The op audit checks the kernels one by one, so it never sees this one (reported, and on no allow-list:
    an audited pass runs the layer step by step)."""
    x, squares, keys, values = array(x), array(squares), array(keys), array(values)
    rows = x.shape[0]
    _report("fused.cached_layer", x, squares)
    return dispatch.launch(_cached_layer[_serially(rows)], x, squares, positions, cache_rows, keys, values, *layer,
                           cos, sin, att_table, sig_table, int(heads), float(qk_limit), float(v_limit), float(eps),
                           float(to_grid), float(unit), _split_heads(rows, keys.shape[1]))


STREAMED_ROWS = 4
"""Products of at most this many rows run as ``int8_product`` where the host's int8 GEMM would take them, which
overtakes the streaming loop at ~5 rows (AVX-512 host, SmolLM2's 120 layer products: 1 row 7.3 → 4.4 ms,
4 rows 9.3 → 6.9 ms, 8 rows 10.4 → 13.4 ms; benchmarks/RESULTS.md, "A one-row product streams the weights")."""

PIECES_STREAMED_ROWS = 32
"""Products of at most this many rows run as ``int8_product`` where the float32 pieces would take them (hosts
whose int8 GEMM is slower or inexact, e.g. AVX2 ones): the pieces convert every weight to float32 per call,
which costs more than streaming dozens of rows (Zen 3, SmolLM2's 120 layer products, streamed / pieces:
5 rows 17 / 52 ms, 16 rows 49 / 80 ms, 32 rows 83 / 105 ms, 48 rows 152 / 146 ms; its output layer 5 rows
9.8 / 40 ms, 32 rows 56 / 70 ms; benchmarks/RESULTS.md, "Drafted passes on an AVX2 host")."""


def streamed_rows(int8_gemm: bool) -> int:
    """The most rows a product streams (``int8_product``) before the host's GEMM takes it: the int8 GEMM
    (``int8_gemm``) or the float32 pieces."""
    return STREAMED_ROWS if int8_gemm else PIECES_STREAMED_ROWS


def int8_product(m: Array, weight_rows: Array) -> Any:
    """``m @ Wᵀ`` of int8 activations ``m (rows, K)`` and int8 weights ``weight_rows (N, K)`` → int32 ``(rows, N)``.

    Why: a decode step of one row multiplies every weight once, so its products are a stream over
    memory, and oneDNN's int8 GEMM streams a one-row product at half this loop's rate (~16 against
    ~30 GB/s here). ``weight_rows`` is ``QuantLinear.weight``'s own storage (each output's weights
    contiguous), so nothing is copied. Why exact on every machine: integer products summed as
    integers, in any order and any instruction set; every sum is below 127·127·K < 2**31 (``K`` ≤
    ``int8_gemm.INT32_TERMS``, checked by the caller and the audit), so the int32 result is the
    product itself, as ``torch._int_mm`` and the float32 pieces give it."""
    m, weight_rows = array(m), array(weight_rows)
    out = np.empty((m.shape[0], weight_rows.shape[0]), dtype=np.int32)
    _report("fused.int8_product", m, weight_rows)
    dispatch.launch(_int8_product, m, weight_rows, out)
    return out


def _fused_instructions() -> list[str]:
    """FMA-like instructions in the machine code of every strict kernel, both variants (must be none):
    inspected where compiled in this process, the compiling process's verdict where loaded from the cache."""
    compiled = [variant for kernel in (_mean_squares, _norm_quantize, _residual, _silu_quantize, _qkv,
                                       _norm_digits, _norm_bytes, _total_logits, _digit_logits)
                for variant in kernel.variants]
    return kernel_cache.inspected([*compiled, _attend_cached, *_cached_layer], _FMA)


@functools.cache
def usable(device: torch.device, float_products: bool = False) -> bool:
    """Whether the fused kernels serve a model on ``device``: numba present, the CPU, and kernels that
    compile here without fused multiply-adds (compiled and inspected once, at model load).
    ``float_products``: the model has linear layers on the float32 path (their GEMM outputs are
    float64, a second compiled variant of three kernels)."""
    if not AVAILABLE or device.type != "cpu":
        return False
    try:
        _warm_up(float_products)
        found = _fused_instructions()
    except Exception as exc:  # numba's errors are many types; any of them means "not here"
        logger.warning("fused exact kernels unavailable (%s: %s): torch's operations are used",
                       type(exc).__name__, exc)
        return False
    if found:
        logger.warning("fused exact kernels refused: the compiler contracted operations (%s)", found[:3])
        return False
    return True


def _warm_up(float_products: bool) -> None:
    """Compile every kernel for the argument types the model passes (int32 GEMM outputs, and float64
    ones with ``float_products``; the int32 cache): the row kernels' parallel variants on two rows,
    their serial ones on one."""
    for rows in (2, 1):
        _warm_up_rows(float_products, rows)


def _warm_up_rows(float_products: bool, rows: int) -> None:
    x = torch.linspace(-3, 3, 24, dtype=torch.float64).view(2, 12)[:rows]
    gain = torch.ones(12, dtype=torch.float64)
    m, steps = norm_quantize(x, gain, 1e-6)
    scale = torch.ones(12, dtype=torch.float64)
    for acc in (m.astype(np.int32), *([m.astype(np.float64)] if float_products else [])):
        residual(x, acc, steps, scale, None, 1e-6)
        silu_quantize(acc, steps, scale, None, torch.zeros(9, dtype=torch.float64))
        qkv(acc, steps, scale, None, torch.zeros(rows, dtype=torch.int64), torch.ones(1, 2, dtype=torch.float64),
            torch.zeros(1, 2, dtype=torch.float64), 2, 2, 2, 8.0, 8.0)
    k = torch.zeros(2, 1, 4, dtype=torch.float64)
    cache = torch.zeros(2, 1, 3, 4, dtype=torch.int32)
    attend_cached(torch.zeros(2, 2, 4, dtype=torch.float64), k, k, cache, cache.clone(),
                  torch.arange(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64), 1.0,
                  torch.ones(5, dtype=torch.float64), V_UNIT)
    digit_logits(np.zeros((3 * rows, 12), dtype=np.int32), norm_digits(x, gain, 1e-6)[1], scale)
    digits, steps, fix_index, fix_value, fix_count = norm_bytes(x, gain, 1e-6)
    total_logits(byte_product(digits, fix_index, fix_value, fix_count, np.ones((12, 12), dtype=np.int8)), steps, scale)
    int8_product(m, m)
    hidden = x[:, :8].contiguous()
    linear = [(np.ones((n, k), dtype=np.int8), np.ones(n), _NO_BIAS) for n, k in ((16, 8), (8, 8), (12, 8), (8, 6))]
    layer = (np.ones(8), *linear[0], *linear[1], np.ones(8), *linear[2], *linear[3])
    cached_layer(hidden, mean_squares(hidden, 1e-6), np.zeros(rows, dtype=np.int64), np.arange(rows, dtype=np.int64),
                 cache, cache.clone(), layer, np.ones((1, 2)), np.zeros((1, 2)), np.ones(5), np.zeros(9), 2, 8.0, 8.0,
                 1e-6, 1.0, V_UNIT)
