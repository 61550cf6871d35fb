"""The exact model's fast kernels: the int8 GEMM is used only where the host's kernel sums exactly,
and the integer-cache attention products equal torch's float64 products bit for bit at the bounds."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from cascade.codec.exact import cache_products, int8_gemm
from cascade.codec.exact.model import ExactConfig, ExactLlama
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.codec.numerics_matrix import CONFIGS, DIGESTS, MAX_POSITIONS, load, random_weights, record

EXPECTED = json.loads(DIGESTS.read_text())
needs_kernels = pytest.mark.skipif(not cache_products.AVAILABLE, reason="numba is not installed")


def saturating_int8_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """What oneDNN's AVX2/SSE4.1 s8·s8 kernels compute: the left operand shifted to unsigned (+128),
    products added in pairs into a saturating int16 (``vpmaddubsw``), then the shift's compensation."""
    u = a.to(torch.int64).numpy() + 128
    w = b.to(torch.int64).numpy()
    k = u.shape[1] + u.shape[1] % 2
    u = np.pad(u, ((0, 0), (0, k - u.shape[1])))
    w = np.pad(w, ((0, k - w.shape[0]), (0, 0)))
    pairs = u[:, 0::2, None] * w[None, 0::2, :] + u[:, 1::2, None] * w[None, 1::2, :]
    total = np.clip(pairs, -32768, 32767).sum(axis=1) - 128 * w.sum(axis=0)[None, :]
    return torch.from_numpy(total.astype(np.int32))


@pytest.fixture
def fresh_probe() -> Iterator[None]:
    int8_gemm.int8_gemm_is_exact.cache_clear()
    yield
    int8_gemm.int8_gemm_is_exact.cache_clear()


def test_the_probe_refuses_a_kernel_that_saturates_pair_sums(fresh_probe: None,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(int8_gemm, "int8_matmul", saturating_int8_matmul)
    assert not int8_gemm.int8_gemm_is_exact(torch.device("cpu"), 64, 24)


def test_the_probe_accepts_a_kernel_that_sums_exactly(fresh_probe: None, monkeypatch: pytest.MonkeyPatch) -> None:
    def exact(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a.to(torch.float64) @ b.to(torch.float64)).to(torch.int32)

    monkeypatch.setattr(int8_gemm, "int8_matmul", exact)
    assert int8_gemm.int8_gemm_is_exact(torch.device("cpu"), 64, 24)


def test_the_probe_refuses_reductions_that_could_overflow_int32(fresh_probe: None) -> None:
    assert not int8_gemm.int8_gemm_is_exact(torch.device("cpu"), int8_gemm.INT32_TERMS + 1, 8)


def test_a_model_on_a_saturating_host_runs_the_float32_path_with_the_same_integers(
        fresh_probe: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(int8_gemm, "int8_matmul", saturating_int8_matmul)
    reference = load("llama-mha", kernels="reference")
    fast = _fresh("llama-mha")
    assert not any(q.int8_gemm for q in fast._linears())
    tokens = [[5, 9, 100, 17, 3, 3, 41, 7, 7]]
    assert torch.equal(fast.logits(fast.prefill(tokens)), reference.logits(reference.prefill(tokens)))


def _fresh(name: str) -> ExactLlama:
    """A new model (``load`` caches one), so its linear layers ask the probe again."""
    config = CONFIGS[name]
    return ExactLlama(ExactConfig.from_hf(config), random_weights(config), MAX_POSITIONS, kernels="fast")


def _cache_operands(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    rows, heads, group = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dim = draw(st.sampled_from([1, 8, 64]))
    capacity = draw(st.integers(1, 40))
    span = draw(st.integers(1, capacity))
    qk = math.isqrt((1 << 53) // dim)
    v_limit = min(1 << 31, (1 << 53) // ((1 << 16) * capacity)) - 1
    seed = draw(st.integers(0, 2**31))
    g = torch.Generator().manual_seed(seed)
    extreme = draw(st.booleans())

    def ints(shape: tuple[int, ...], limit: int) -> torch.Tensor:
        if extreme:
            signs = torch.randint(0, 2, shape, generator=g) * 2 - 1
            return signs.to(torch.int64) * limit
        return torch.randint(-limit, limit + 1, shape, generator=g, dtype=torch.int64)

    q = ints((rows, heads, group, dim), qk).to(torch.float64)
    keys = ints((rows, heads, capacity, dim), min(qk, (1 << 31) - 1)).to(torch.int32)
    values = ints((rows, heads, capacity, dim), v_limit).to(torch.int32)
    p = torch.randint(0, (1 << 16) + 1, (rows, heads, group, span), generator=g).to(torch.float64)
    return q, keys, values, p, span


@needs_kernels
@settings(max_examples=60, deadline=None)
@given(st.composite(_cache_operands)())
def test_integer_cache_products_equal_float64_bmm_bit_for_bit(
        operands: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]) -> None:
    q, keys, values, p, span = operands
    k = keys[:, :, :span].to(torch.float64)
    v = values[:, :, :span].to(torch.float64)
    assert torch.equal(cache_products.scores(q, keys, span), q @ k.transpose(-1, -2))
    assert torch.equal(cache_products.weighted(p, values, span), p @ v)


@needs_kernels
def test_integer_cache_products_are_right_when_called_from_many_threads_at_once() -> None:
    g = torch.Generator().manual_seed(3)
    q = torch.randint(-1000, 1000, (4, 2, 3, 64), generator=g).to(torch.float64)
    keys = torch.randint(-1000, 1000, (4, 2, 50, 64), generator=g, dtype=torch.int32)
    expected = q @ keys.to(torch.float64).transpose(-1, -2)
    results: list[bool] = []

    def run() -> None:
        results.extend(torch.equal(cache_products.scores(q, keys, 50), expected) for _ in range(20))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 80


@needs_kernels
def test_a_host_where_the_cache_kernels_fail_keeps_torchs_kernels_with_the_same_integers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("no compiler here")

    cache_products._compiles.cache_clear()
    monkeypatch.setattr(cache_products, "_scores", broken)
    try:
        model = _fresh("qwen2-gqa2-bias")
        assert model.kernels.name == "torch" and "torch kernel set" in model.kernel_summary()
        assert record(model) == EXPECTED["qwen2-gqa2-bias"]
    finally:
        cache_products._compiles.cache_clear()


@needs_kernels
def test_the_cache_kernels_leave_the_callers_torch_thread_count_as_it_was() -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        q = torch.ones(1, 1, 1, 8, dtype=torch.float64)
        keys = torch.ones(1, 1, 4, 8, dtype=torch.int32)
        assert torch.equal(cache_products.scores(q, keys, 4), torch.full((1, 1, 1, 4), 8.0, dtype=torch.float64))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
