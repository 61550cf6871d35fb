"""``pair_dot``: the 16-lane pairwise int16 × int8 dot product the compiled products run on."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

numba = pytest.importorskip("numba")
from cascade.codec.exact.pair_dot import pair_dot  # noqa: E402


@numba.njit
def _dot(a: np.ndarray, w: np.ndarray) -> int:
    return pair_dot(a, w)  # type: ignore[no-any-return]


def _wrapped(total: int) -> int:
    return (total + 2**31) % 2**32 - 2**31


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 100), st.integers(0, 2**31), st.sampled_from(["int8", "int16", "extremes"]))
def test_pair_dot_is_the_int64_dot_product_wrapped_to_int32(n: int, seed: int, values: str) -> None:
    """Every length (whole 16-lane blocks and the tail), and sums past int32, which wrap as the plain
    loop's int64 sum truncated to int32 does."""
    rng = np.random.default_rng(seed)
    low, high = (-128, 128) if values == "int8" else (-2**15, 2**15)
    a = rng.integers(low, high, n + 3).astype(np.int16)  # longer than w: only len(w) terms count
    w = rng.integers(-128, 128, n).astype(np.int8)
    if values == "extremes":
        a[:], w[:] = -2**15, -128
    expected = int(a[:n].astype(np.int64) @ w.astype(np.int64))
    assert _dot(a, w) == _wrapped(expected)


def test_pair_dot_refuses_arrays_it_cannot_read_as_contiguous_lanes() -> None:
    a = np.zeros(64, dtype=np.int16)
    w = np.zeros(64, dtype=np.int8)
    with pytest.raises(numba.core.errors.TypingError):
        _dot(a[::2], w[:32])
    with pytest.raises(numba.core.errors.TypingError):
        _dot(a.astype(np.int32), w)


def test_the_compiled_products_multiply_sixteen_lanes_at_a_time_on_x86() -> None:
    """What the 16-lane form is for: LLVM emits ``vpmaddwd`` (or VNNI's ``vpdpwssd``) on 256-bit or wider
    registers for it, on every x86-64 host with AVX2; elsewhere this checks only that it compiles."""
    a, w = np.zeros(64, dtype=np.int16), np.zeros(64, dtype=np.int8)
    assert _dot(a, w) == 0
    import llvmlite.binding as llvm

    if numba.config.CPU_NAME or not llvm.get_host_cpu_features().get("avx2", False):
        pytest.skip("not compiled for an AVX2 host: the check is about x86-64 vector widths")
    assembly = _dot.inspect_asm(_dot.signatures[0])
    assert any(op in line and ("%ymm" in line or "%zmm" in line)
               for line in assembly.splitlines() for op in ("vpmaddwd", "vpdpwssd"))
