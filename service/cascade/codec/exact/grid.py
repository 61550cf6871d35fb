"""The exact model's fixed-point grids and exactness limits, in one place.

Every number here is part of ``exact-llama-1``: the torch kernels (``ops``, ``kernels``), the compiled
kernels (``fused``, which numba reads as compile-time constants) and the op audit (``audit``) take
them from this module, so no kernel restates a grid.
"""

from __future__ import annotations

import torch

from cascade.codec.exact import tables

ACT8 = 127.0
"""Linear layers' activations: per-token integers in ±127 (int8)."""
ACT16 = 32767.0
"""The output layer's activations and RMSNorm's sum of squares: per-token integers in ±32,767."""
DIGIT = 2.0**-7
"""The output layer's int16 activations as three int8 digits ``a·2**14 + b·2**7 + c`` (products by 2**-7)."""
BYTE = 2.0**-8
"""The same activations as two int8 digits ``h·2**8 + l`` and a correction (the compiled output layer)."""
BYTE_TERMS = ((1 << 31) - 1) // (128 * 127)
"""The longest output-layer row whose two-digit sums stay in int32 (digits −128…127, weights ±127)."""
FP32_EXACT = 1 << 24
"""Integers below this are exact in float32 (a float32 GEMM piece's partial sums stay below it)."""
FP64_EXACT = 1 << 53
"""Integers below this are exact in float64 (every other integer sum stays below it)."""
FP32_PIECE_TERMS = (FP32_EXACT - 1) // int(ACT8 * ACT8)
"""The longest float32 GEMM piece of ±127 integers: 127·127·1040 < 2**24."""
QK_BITS = 10
"""Queries and keys on the 2**-10 grid (after RoPE)."""
V_BITS = 10
"""Values on the 2**-10 grid."""
QK_UNIT = float(1 << QK_BITS)
V_UNIT = float(1 << V_BITS)
SIG_UNIT = float(1 << tables.SIG_GRID_BITS)
"""SiLU's sigmoid table is read at ``rint(x · 2**10)``."""
MASKED = -float(1 << 60)
"""A masked attention score: below every real one (|score| < 2**53), so its weight is the table's 0."""
RINT_MAGIC = 1.5 * 2.0**52
"""``(x + 1.5·2**52) − 1.5·2**52`` is ``x`` rounded half to even, exactly, for |x| < 2**51."""
RINT_LIMIT = 2.0**50
"""``rint`` clamps to ±2**50 first, far beyond any value the model produces."""


def rint(x: torch.Tensor) -> torch.Tensor:
    """Round half to even, as ``torch.round`` but an order of magnitude faster on CPU: adding and
    subtracting 1.5·2**52 leaves the nearest integer (IEEE round-to-nearest-even), exactly, for
    |x| < 2**51; inputs are clamped to ±2**50 first."""
    return rint_(x.clamp(-RINT_LIMIT, RINT_LIMIT))


def rint_(x: torch.Tensor) -> torch.Tensor:
    """``rint`` in place, for values the caller knows lie within ±2**50."""
    return x.add_(RINT_MAGIC).sub_(RINT_MAGIC)
