"""Lookup tables for the exact model's nonlinearities, built with exact arithmetic only.

Every table entry is computed with Python's ``decimal`` (libmpdec, the same algorithm on every
machine) or with Python integers, then rounded once to the nearest float64 (``float(Decimal)`` and
``int / int`` are correctly rounded). So the tables are identical on every machine, and no libm
transcendental — whose last bit differs between libraries and instruction sets — is ever called
when the codec runs. Pure: no torch import.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Context, Decimal, DivisionByZero, InvalidOperation, Overflow, localcontext

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

# Attention weights: p = round(2**ATT_ONE_BITS · exp(-d)), d on a grid of 2**-ATT_GRID_BITS nats.
ATT_GRID_BITS = 10
ATT_ONE_BITS = 16
ATT_RANGE_NATS = 24
# SiLU: sigmoid on a grid of 2**-SIG_GRID_BITS over [-SIG_RANGE, SIG_RANGE].
SIG_GRID_BITS = 10
SIG_RANGE = 16
_PREC = 50
_ROT_BITS = 160
_PI = Decimal("3.14159265358979323846264338327950288419716939937510582097494459230781640628620899")


def exact_context(precision: int = _PREC) -> Context:
    """The one ``decimal`` context every table is built under: its precision AND its rounding are
    fixed here, so a caller's thread context (``decimal.getcontext()``, which code anywhere in the
    process may change) can never alter a table entry. ``localcontext(exact_context())`` installs a
    copy for the block."""
    return Context(prec=precision, rounding=ROUND_HALF_EVEN, Emin=-999999, Emax=999999, capitals=1, clamp=0,
                   flags=[], traps=[InvalidOperation, DivisionByZero, Overflow])


def _exp_powers(grid_bits: int, count: int) -> list[Decimal]:
    """``e^(-i / 2**grid_bits)`` for ``i < count``, by repeated multiplication at 50 digits (deterministic
    everywhere; the accumulated error, ~count·10**-50, never reaches a float64 or integer rounding)."""
    step = (Decimal(-1) / Decimal(1 << grid_bits)).exp()
    powers = [Decimal(1)]
    for _ in range(count - 1):
        powers.append(powers[-1] * step)
    return powers


@functools.cache
def attention_exp_table() -> FloatArray:
    """``round(2**16 · e^(-i / 2**10))`` for ``i`` in ``0 … 24·2**10``; the last entry is 0 (the cut-off)."""
    with localcontext(exact_context()):
        one = Decimal(1 << ATT_ONE_BITS)
        powers = _exp_powers(ATT_GRID_BITS, ATT_RANGE_NATS << ATT_GRID_BITS)
        values = [int((one * e).to_integral_value()) for e in powers]
    return np.array([*values, 0], dtype=np.float64)


@functools.cache
def sigmoid_table() -> FloatArray:
    """``1 / (1 + e^(-x))`` at ``x = i / 2**10`` for ``i`` in ``-16·2**10 … 16·2**10``, correctly rounded."""
    with localcontext(exact_context()):
        exps = _exp_powers(SIG_GRID_BITS, (SIG_RANGE << SIG_GRID_BITS) + 1)
        positive = [float(1 / (1 + e)) for e in exps]
        negative = [float(e / (1 + e)) for e in exps]
    return np.array(negative[:0:-1] + positive, dtype=np.float64)


def _cos_sin(angle: Decimal) -> tuple[Decimal, Decimal]:
    """Taylor series after reduction to ``[-π, π]``, at ``_PREC`` digits."""
    two_pi = 2 * _PI
    angle = angle - two_pi * (angle / two_pi).to_integral_value()
    term = Decimal(1)
    cos, sin = Decimal(0), Decimal(0)
    n = 0
    while True:
        if n % 4 == 0:
            cos += term
        elif n % 4 == 1:
            sin += term
        elif n % 4 == 2:
            cos -= term
        else:
            sin -= term
        n += 1
        term = term * angle / n
        if abs(term) < Decimal(10) ** (-_PREC + 2):
            return cos, sin


@dataclass(frozen=True)
class RopeScaling:
    """A checkpoint's RoPE scaling, as Hugging Face configs and vLLM define it.

    ``default``: none; ``linear``: every frequency ÷ ``factor``; ``dynamic``: the fixed NTK-aware
    base vLLM 0.32 serves (``DynamicNTKScalingRotaryEmbedding``: ``theta · (factor · max_positions /
    original_max_positions − (factor − 1)) ** (dim / (dim − 2))``, ``original_max_positions`` being
    ``max_trained_positions``, which defaults to ``max_positions``); ``llama3``: Llama 3.1/3.2's
    per-wavelength blend of the plain and the ÷ ``factor`` frequencies. Numbers are kept as the
    config wrote them (``repr`` of the float) and turned into decimals, so the tables depend on
    nothing but the config."""

    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 0
    max_positions: int = 0


def _dec(x: float) -> Decimal:
    return Decimal(repr(float(x)))


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling = RopeScaling()) -> list[Decimal]:
    """``theta ** (-2j / head_dim)`` for ``j < head_dim / 2``, then scaled as ``scaling`` says, at
    ``_PREC`` digits under ``exact_context``."""
    with localcontext(exact_context()):
        log_theta = _dec(theta).ln()
        factor = _dec(scaling.factor)
        if scaling.kind == "dynamic":
            ratio = factor * scaling.max_positions / Decimal(scaling.original_max_positions) - (factor - 1)
            log_theta += Decimal(head_dim) / Decimal(head_dim - 2) * ratio.ln()
        plain = [(-(Decimal(2 * j) / head_dim) * log_theta).exp() for j in range(head_dim // 2)]
        if scaling.kind == "linear":
            return [f / factor for f in plain]
        if scaling.kind != "llama3":
            return plain
        old = Decimal(scaling.original_max_positions)
        low, high = _dec(scaling.low_freq_factor), _dec(scaling.high_freq_factor)
        low_wavelen, high_wavelen = old / low, old / high
        out = []
        for f in plain:
            wavelen = 2 * _PI / f
            if wavelen < high_wavelen:
                out.append(f)
            elif wavelen > low_wavelen:
                out.append(f / factor)
            else:
                smooth = (old / wavelen - low) / (high - low)
                out.append((1 - smooth) * f / factor + smooth * f)
        return out


@functools.cache
def rope_tables(head_dim: int, theta: float, max_positions: int, scaling: RopeScaling = RopeScaling()
                ) -> tuple[FloatArray, FloatArray]:
    """cos and sin of ``position · inv_freq[j]``, shape ``(max_positions, head_dim // 2)``.

    One rotation per frequency is computed with ``decimal``; positions follow by exact complex
    multiplication in 160-bit fixed point (Python integers), so the table costs milliseconds and
    its rounding error (~2**-140) is far below float64's.
    """
    one = 1 << _ROT_BITS
    cos = np.empty((max_positions, head_dim // 2), dtype=np.float64)
    sin = np.empty_like(cos)
    with localcontext(exact_context()):
        for j, freq in enumerate(inverse_frequencies(head_dim, theta, scaling)):
            c1, s1 = _cos_sin(freq)
            step_c, step_s = int((c1 * one).to_integral_value()), int((s1 * one).to_integral_value())
            c, s = one, 0
            for position in range(max_positions):
                cos[position, j] = c / one
                sin[position, j] = s / one
                c, s = (c * step_c - s * step_s) >> _ROT_BITS, (c * step_s + s * step_c) >> _ROT_BITS
    return cos, sin
