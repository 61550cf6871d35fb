"""The exact model's fast kernels: the int8 GEMM is used only where the host's kernel sums exactly,
and the compiled cached attention equals the torch definition bit for bit at the bounds."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from cascade.codec.exact import int8_gemm, ops
from cascade.codec.exact.grid import ACT8, ACT16
from cascade.codec.exact.kernels import CompiledKernels, Geometry, TorchKernels
from cascade.codec.exact.model import ExactConfig, ExactLlama
from cascade.codec.exact.ops import QuantLinear
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.codec.numerics_matrix import CONFIGS, MAX_POSITIONS, load, needs_compiled, random_weights


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
    int8_gemm.int8_gemm_is_faster.cache_clear()
    yield
    int8_gemm.int8_gemm_is_exact.cache_clear()
    int8_gemm.int8_gemm_is_faster.cache_clear()


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


def test_the_speed_probe_keeps_the_float32_path_where_the_exact_int8_gemm_is_slower(
        fresh_probe: None, monkeypatch: pytest.MonkeyPatch) -> None:
    def slow(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        time.sleep(0.2)
        return (a.to(torch.float64) @ b.to(torch.float64)).to(torch.int32)

    monkeypatch.setattr(int8_gemm, "int8_matmul", slow)
    assert not int8_gemm.int8_gemm_is_faster(torch.device("cpu"), 64, 24)


def test_the_speed_probe_takes_the_int8_gemm_where_it_is_faster(fresh_probe: None,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    answer = torch.zeros((64, 24), dtype=torch.int32)
    monkeypatch.setattr(int8_gemm, "int8_matmul", lambda a, b: answer)
    assert int8_gemm.int8_gemm_is_faster(torch.device("cpu"), 64, 24)


def test_a_model_whose_int8_gemm_is_slower_runs_the_float32_path_with_the_same_integers(
        fresh_probe: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops, "int8_gemm_is_faster", lambda device, k, n: False)
    reference = load("llama-mha", kernels="reference")
    fast = _fresh("llama-mha")
    assert not any(q.int8_gemm for q in fast._linears())
    tokens = [[5, 9, 100, 17, 3, 3, 41, 7, 7], [8, 1, 2]]
    hidden, expected = fast.prefill(tokens), reference.prefill(tokens)
    assert torch.equal(hidden, expected)
    for rows in (1, 2, 3, 12):
        assert torch.equal(fast.logits(hidden[:rows]), reference.logits(expected[:rows]))


@pytest.mark.parametrize("act_max", [ACT8, ACT16])
@pytest.mark.parametrize("rows", [5, ops.F64_GEMM_ROWS - 1, ops.F64_GEMM_ROWS])
@pytest.mark.parametrize("terms", [96, 1100], ids=["one piece", "two pieces"])
def test_the_float32_path_over_blocks_of_outputs_is_the_exact_integer_product(act_max: float, rows: int,
                                                                              terms: int) -> None:
    """Every way the float path takes: float32 pieces (one, or several added in float64), the output
    layer's two float32 digit rows under ``F64_GEMM_ROWS`` rows and its float64 GEMM from there on."""
    g = torch.Generator().manual_seed(7)
    out = 2 * ops.F32_COLUMNS + 37
    linear = QuantLinear(torch.randn(out, terms, generator=g), None, act_max, torch.device("cpu"))
    m = torch.randint(-int(act_max), int(act_max) + 1, (rows, terms), generator=g).to(torch.float64)
    m[0] = act_max
    m[1] = -act_max
    assert not linear.int8_gemm
    assert torch.equal(linear.exact_product(m), m @ linear.weight.to(torch.float64))


def _fresh(name: str) -> ExactLlama:
    """A new model (``load`` caches one), so its linear layers ask the probe again."""
    config = CONFIGS[name]
    return ExactLlama(ExactConfig.from_hf(config), random_weights(config), MAX_POSITIONS, kernels="fast")


AttentionCase = tuple[Geometry, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                      torch.Tensor, torch.Tensor]


def _attention_case(draw: st.DrawFn) -> AttentionCase:
    """A decode or verify pass at the geometry's bounds: ``q, k, v`` of its queries, an int32 cache already
    holding earlier positions, and each query's cache row and position (a row's queries at consecutive
    positions from its length, as a lane's fed token and its draft are)."""
    geometry = load(draw(st.sampled_from(list(CONFIGS)))).geometry
    capacity = draw(st.integers(1, 48))
    cache_rows: list[int] = []
    positions: list[int] = []
    for row in range(draw(st.integers(1, 3))):
        length = draw(st.integers(0, capacity - 1))
        fed = draw(st.integers(1, capacity - length))
        cache_rows += [row] * fed
        positions += range(length, length + fed)
    n, g = len(positions), torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    extreme = draw(st.booleans())

    def ints(shape: tuple[int, ...], limit: float) -> torch.Tensor:
        bound = int(limit)
        if extreme:
            return ((torch.randint(0, 2, shape, generator=g) * 2 - 1) * bound).to(torch.float64)
        return torch.randint(-bound, bound + 1, shape, generator=g, dtype=torch.int64).to(torch.float64)

    heads, kv_heads, dim = geometry.num_heads, geometry.num_kv_heads, geometry.head_dim
    keys = ints((3, kv_heads, capacity, dim), geometry.qk_limit).to(torch.int32)
    values = ints((3, kv_heads, capacity, dim), geometry.v_limit).to(torch.int32)
    return (geometry, ints((n, heads, dim), geometry.qk_limit), ints((n, kv_heads, dim), geometry.qk_limit),
            ints((n, kv_heads, dim), geometry.v_limit), keys, values, torch.tensor(cache_rows), torch.tensor(positions))


@needs_compiled
@settings(max_examples=60, deadline=None)
@given(st.composite(_attention_case)())
def test_compiled_cached_attention_equals_the_torch_definition_bit_for_bit(case: AttentionCase) -> None:
    geometry, q, k, v, keys, values, cache_rows, positions = case
    span = int(positions.max()) + 1
    expected_keys, expected_values = keys.clone(), values.clone()
    expected_m, expected_steps = TorchKernels(geometry).attend_cached(q, k, v, expected_keys, expected_values,
                                                                      cache_rows, positions, span)
    got = CompiledKernels(geometry).attend_cached(q, k, v, keys, values, cache_rows, positions, span)
    m, steps = (torch.from_numpy(a) for a in got)
    assert torch.equal(keys, expected_keys) and torch.equal(values, expected_values)
    assert torch.equal(m.to(torch.float64), expected_m) and torch.equal(steps, expected_steps[:, 0])


def _small_attention() -> tuple[CompiledKernels, list[torch.Tensor]]:
    geometry = load("llama-mha").geometry
    g = torch.Generator().manual_seed(3)
    heads, kv_heads, dim = geometry.num_heads, geometry.num_kv_heads, geometry.head_dim
    q = torch.randint(-1000, 1000, (4, heads, dim), generator=g).to(torch.float64)
    k, v = (torch.randint(-1000, 1000, (4, kv_heads, dim), generator=g).to(torch.float64) for _ in range(2))
    cache = torch.randint(-1000, 1000, (4, kv_heads, 50, dim), generator=g, dtype=torch.int32)
    return CompiledKernels(geometry), [q, k, v, cache, cache.clone(), torch.arange(4), torch.full((4,), 49)]


@needs_compiled
def test_compiled_cached_attention_is_right_when_called_from_many_threads_at_once() -> None:
    kernels, args = _small_attention()
    expected = kernels.attend_cached(*[a.clone() for a in args], 50)
    results: list[bool] = []

    def run() -> None:
        for _ in range(20):
            m, steps = kernels.attend_cached(*[a.clone() for a in args], 50)
            results.append(np.array_equal(m, expected[0]) and np.array_equal(steps, expected[1]))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 80


@needs_compiled
def test_compiled_kernels_leave_the_callers_torch_thread_count_as_it_was() -> None:
    before = torch.get_num_threads()
    kernels, args = _small_attention()
    try:
        torch.set_num_threads(1)
        m, _ = kernels.attend_cached(*args, 50)
        assert m.dtype == np.int8 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
