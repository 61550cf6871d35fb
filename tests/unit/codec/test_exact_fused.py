"""The fused elementwise kernels compute what the torch path computes, bit for bit, and are refused
where the compiler would contract operations into fused multiply-adds."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch
from cascade.codec.exact import dispatch, fused, tables
from cascade.codec.exact.cache import KVCache
from cascade.codec.exact.grid import ACT8, BYTE_TERMS, RINT_LIMIT, rint_
from cascade.codec.exact.kernels import TorchKernels
from cascade.codec.exact.ops import QuantLinear, rms_norm, silu
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.codec.numerics_matrix import (
    CONFIGS,
    DIGESTS,
    MAX_POSITIONS,
    load,
    needs_compiled,
    random_weights,
    record,
)

EXPECTED = json.loads(DIGESTS.read_text())
CPU = torch.device("cpu")


def reference_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``QuantLinear``'s activation grid, as the torch path computes it."""
    amax = x.abs().amax(dim=1, keepdim=True)
    step = torch.where(amax > 0, amax, torch.ones_like(amax)) / torch.tensor(ACT8, dtype=torch.float64)
    return rint_(x / step), step[:, 0]


def rows_of(draw: st.DrawFn, rows: int, width: int, seed: int) -> torch.Tensor:
    """Random rows at magnitudes from 1e-3 to 1e3, some all zero, some with one outlier."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=g, dtype=torch.float64)
    x *= torch.tensor(10.0, dtype=torch.float64) ** torch.randint(-3, 4, (rows, 1), generator=g)
    if draw(st.booleans()):
        x[0] = 0.0
    if rows > 1 and draw(st.booleans()):
        x[1, draw(st.integers(0, width - 1))] = 1e4
    return x


@st.composite
def linear_case(draw: st.DrawFn) -> tuple[torch.Tensor, QuantLinear, bool]:
    rows, width, out = draw(st.integers(1, 40)), draw(st.integers(2, 96)), draw(st.integers(1, 80))
    seed = draw(st.integers(0, 2**31))
    g = torch.Generator().manual_seed(seed + 1)
    bias = torch.randn(out, generator=g) if draw(st.booleans()) else None
    linear = QuantLinear(torch.randn(out, width, generator=g), bias, ACT8, CPU)
    return rows_of(draw, rows, width, seed), linear, draw(st.booleans())


@contextlib.contextmanager
def row_launches(parallel: bool) -> Iterator[None]:
    """Every row kernel launched in parallel, or every one serially (in service one row runs serially)."""
    def launch(kernel: Any, rows: int, *args: Any) -> None:
        (kernel.parallel if parallel else kernel.serial)(*args)

    with mock.patch.object(fused._RowKernel, "__call__", launch):
        yield


def tensors(*arrays: np.ndarray) -> tuple[torch.Tensor, ...]:
    """The fused kernels' results (numpy arrays, the compiled set's values) as tensors."""
    return tuple(torch.from_numpy(a) for a in arrays)


def exact_product(m: torch.Tensor, linear: QuantLinear, as_int32: bool) -> torch.Tensor:
    acc = m.to(torch.float64) @ linear.weight.to(torch.float64)  # integers far below 2**53: exact
    return acc.to(torch.int32) if as_int32 else acc


@needs_compiled
@settings(max_examples=60, deadline=None)
@given(linear_case(), st.booleans())
def test_norm_quantize_and_residual_equal_the_torch_rmsnorm_and_linear_layer(
        case: tuple[torch.Tensor, QuantLinear, bool], parallel: bool) -> None:
    with row_launches(parallel):
        _norm_quantize_and_residual_equal_the_torch_path(*case)


def _norm_quantize_and_residual_equal_the_torch_path(x: torch.Tensor, linear: QuantLinear, as_int32: bool) -> None:
    gain = 1 + torch.linspace(-0.5, 0.5, x.shape[1], dtype=torch.float64)
    m, steps = tensors(*fused.norm_quantize(x, gain, 1e-6))
    expected_m, expected_steps = reference_quantize(rms_norm(x, gain, 1e-6))
    assert torch.equal(m.to(torch.float64), expected_m) and torch.equal(steps, expected_steps)
    acc = exact_product(m, linear, as_int32)
    residual = torch.randn(x.shape[0], linear.out_features, dtype=torch.float64)
    out, squares = tensors(*fused.residual(residual, acc, steps, linear.scale, linear.bias, 1e-6))
    assert torch.equal(out, residual + linear(rms_norm(x, gain, 1e-6)))
    ones = torch.ones(out.shape[1], dtype=torch.float64)
    m2, steps2 = tensors(*fused.norm_quantize(out, ones, 1e-6, squares))
    expected_m2, expected_steps2 = reference_quantize(rms_norm(out, ones, 1e-6))
    assert torch.equal(m2.to(torch.float64), expected_m2) and torch.equal(steps2, expected_steps2)


@needs_compiled
def test_the_fused_rmsnorm_takes_torchs_square_root_which_exact_llama_1_is_defined_by() -> None:
    """torch's CPU sqrt is not always the correctly rounded root (~1 % of inputs); 4,096 rows make a
    kernel that took its own root differ in some step (the steps are sensitive to one ulp)."""
    x = torch.randn(4096, 64, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    gain = torch.ones(64, dtype=torch.float64)
    _, steps = tensors(*fused.norm_quantize(x, gain, 1e-5))
    assert torch.equal(steps, reference_quantize(rms_norm(x, gain, 1e-5))[1])


@needs_compiled
@settings(max_examples=40, deadline=None)
@given(linear_case(), st.booleans())
def test_silu_quantize_equals_the_torch_mlp_activation(case: tuple[torch.Tensor, QuantLinear, bool],
                                                       parallel: bool) -> None:
    x, linear, as_int32 = case
    if linear.out_features % 2:
        return
    with row_launches(parallel):
        _silu_quantize_equals_the_torch_path(x, linear, as_int32)


def _silu_quantize_equals_the_torch_path(x: torch.Tensor, linear: QuantLinear, as_int32: bool) -> None:
    m, steps = reference_quantize(x)
    acc = exact_product(m, linear, as_int32)
    table = torch.from_numpy(tables.sigmoid_table())
    gate_up = linear(x)
    half = linear.out_features // 2
    expected_m, expected_steps = reference_quantize(silu(gate_up[:, :half], table) * gate_up[:, half:])
    got_m, got_steps = tensors(*fused.silu_quantize(acc, steps, linear.scale, linear.bias, table))
    assert torch.equal(got_m.to(torch.float64), expected_m) and torch.equal(got_steps, expected_steps)


@needs_compiled
@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "parallel"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_qkv_and_cached_attention_equal_the_torch_path_of_the_model(name: str, parallel: bool) -> None:
    with row_launches(parallel):
        _qkv_and_cached_attention_equal_the_torch_path(name)


def _qkv_and_cached_attention_equal_the_torch_path(name: str) -> None:
    model = load(name, kernels="reference")
    c = model.config
    layer = model.layers[0]
    g = torch.Generator().manual_seed(9)
    rows, span = 5, 40
    x = torch.randn(rows, c.hidden_size, generator=g, dtype=torch.float64)
    positions = torch.tensor([0, 3, 39, 17, 39])
    torch_kernels, geo = TorchKernels(model.geometry), model.geometry
    q, k, v = torch_kernels.qkv(layer.qkv, torch_kernels.norm_quantize(x, layer.attn_norm), positions)
    m, steps = tensors(*fused.norm_quantize(x, layer.attn_norm, c.rms_norm_eps))
    qkv = layer.qkv
    got = tensors(*fused.qkv(exact_product(m, qkv, True), steps, qkv.scale, qkv.bias, positions, geo.cos, geo.sin,
                             c.num_heads, c.num_kv_heads, c.head_dim, geo.qk_limit, geo.v_limit))
    assert all(torch.equal(a, b) for a, b in zip(got, (q, k, v), strict=True))
    cache = model.allocate_cache(rows, span + 8)
    for li in range(len(cache.keys)):
        cache.keys[li].random_(-3000, 3000, generator=g)
        cache.values[li].random_(-3000, 3000, generator=g)
    expected_keys, expected_values = cache.keys[0].clone(), cache.values[0].clone()
    expected = torch_kernels.attend_cached(q, k, v, expected_keys, expected_values, torch.arange(rows), positions,
                                           span)
    got = tensors(*fused.attend_cached(q, k, v, cache.keys[0], cache.values[0], torch.arange(rows), positions,
                                       geo.score_to_grid, geo.att_exp, 1024.0))
    assert torch.equal(cache.keys[0], expected_keys) and torch.equal(cache.values[0], expected_values)
    assert torch.equal(got[0].to(torch.float64), expected[0]) and torch.equal(got[1], expected[1][:, 0])


@needs_compiled
@settings(max_examples=60, deadline=None)
@given(st.integers(1, fused.STREAMED_ROWS + 2), st.integers(1, 700), st.integers(1, 80), st.integers(0, 2**31),
       st.sampled_from(["random", "extremes"]))
def test_the_streamed_int8_product_is_the_exact_integer_product(rows: int, k: int, n: int, seed: int,
                                                                 values: str) -> None:
    g = torch.Generator().manual_seed(seed)
    m = torch.randint(-127, 128, (rows, k), generator=g, dtype=torch.int8)
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    if values == "extremes":  # every product at ±127·127, the sums at their bound's sign
        m[0::2], m[1::2], w[0::2], w[1::2] = 127, -127, 127, -127
    got = torch.from_numpy(fused.int8_product(m, w))
    assert got.dtype == torch.int32
    assert torch.equal(got.to(torch.float64), m.to(torch.float64) @ w.to(torch.float64).t())


@needs_compiled
def test_the_streamed_int8_product_holds_the_longest_sums_int32_can() -> None:
    k = (2**31 - 1) // (127 * 127)
    m = torch.full((1, k), 127, dtype=torch.int8)
    w = torch.stack([torch.full((k,), 127, dtype=torch.int8), torch.full((k,), -127, dtype=torch.int8)])
    assert fused.int8_product(m, w).tolist() == [[127 * 127 * k, -127 * 127 * k]]


@needs_compiled
@settings(max_examples=80, deadline=None)
@given(st.integers(1, 3), st.integers(1, 700), st.integers(1, 60), st.integers(0, 2**31),
       st.sampled_from(["random", "flat", "signs", "spread"]))
def test_the_output_layer_in_two_digits_gives_the_three_digit_products_and_their_logits(
        rows: int, k: int, n: int, seed: int, values: str) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g, dtype=torch.float64) * 4
    if values == "flat":  # every element at +32,767: every one needs a correction
        x[0] = 3.0
    elif values == "signs":  # ±32,767: the lowest top digit (−128) beside corrections
        x[0] = torch.where(torch.arange(k) % 2 == 0, 3.0, -3.0)
    elif values == "spread":
        x *= torch.tensor(10.0, dtype=torch.float64) ** torch.randint(-3, 4, (rows, k), generator=g)
    gain = torch.rand(k, generator=g, dtype=torch.float64) + 0.5
    if values in ("flat", "signs"):
        gain[:] = 1.0
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    scale = torch.rand(n, generator=g, dtype=torch.float64) * 1e-3
    three, steps3 = fused.norm_digits(x, gain, 1e-6)
    digits, steps, fix_index, fix_value, fix_count = fused.norm_bytes(x, gain, 1e-6)
    assert np.array_equal(steps, steps3)
    m3 = ((three[:rows].astype(np.int64) * 128 + three[rows:2 * rows]) * 128 + three[2 * rows:])
    m2 = digits[:rows].astype(np.int64) * 256 + digits[rows:]
    for r in range(rows):
        m2[r, fix_index[r, :fix_count[r]]] += fix_value[r, :fix_count[r]]
    assert np.array_equal(m2, m3)
    assert ((fix_value >= 0) & (fix_value <= 128)).all()
    exact = m3 @ w.numpy().astype(np.int64).T
    totals = fused.byte_product(digits, fix_index, fix_value, fix_count, w)
    assert totals.dtype == np.float64 and np.array_equal(totals.astype(np.int64), exact)
    recombined = fused.int8_product(three, w).astype(np.float64)  # the GEMM path's three digit products
    recombined = (recombined[:rows] * 128.0 + recombined[rows:2 * rows]) * 128.0 + recombined[2 * rows:]
    assert np.array_equal(totals, recombined)
    expected = np.rint(exact.astype(np.float64) * (steps[:, None] * scale.numpy()[None, :])).astype(np.int64)
    assert np.array_equal(fused.total_logits(totals, steps, scale), expected)


@needs_compiled
@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "parallel"])
@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(1, 300), st.integers(0, 2**31), st.booleans())
def test_digit_products_recombined_in_the_logits_pass_give_the_torch_recombinations_logits(
        parallel: bool, rows: int, vocab: int, seed: int, extremes: bool) -> None:
    g = np.random.default_rng(seed)
    limit = 2**31 - 1
    products = g.integers(-limit, limit, (3 * rows, vocab), endpoint=True).astype(np.int32)
    if extremes:  # the largest int32 digit sums of either sign
        products[::2] = limit
        products[1::2] = -limit
    steps = g.random(rows) * 1e-3
    scale = g.random(vocab) * 1e-3
    totals = torch.from_numpy(products[:rows]).to(torch.float64)  # ``ops.digit_product``'s recombination
    totals = totals.mul_(128.0).add_(torch.from_numpy(products[rows:2 * rows])).mul_(128.0)
    totals = totals.add_(torch.from_numpy(products[2 * rows:]))
    with row_launches(parallel):
        got = fused.digit_logits(products, steps, scale)
        expected = fused.total_logits(totals, steps, scale)
    assert got.dtype == np.int64 and np.array_equal(got, expected)


@needs_compiled
def test_the_two_digit_output_layer_refuses_rows_its_int32_digit_sums_cannot_hold() -> None:
    k = BYTE_TERMS + 1
    digits, *fixes = (np.zeros((2, k), dtype=np.int8), np.zeros((1, k), dtype=np.int64),
                      np.zeros((1, k), dtype=np.int64), np.zeros(1, dtype=np.int64))
    with pytest.raises(ValueError, match="overflow"):
        fused.byte_product(digits, *fixes, np.zeros((1, k), dtype=np.int8))


@needs_compiled
def test_the_compiled_kernels_hold_no_fused_multiply_add() -> None:
    assert fused._fused_instructions() == []


@needs_compiled
def test_a_host_whose_compiler_contracts_operations_keeps_torchs_operations_with_the_same_integers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from cascade.codec.exact.model import ExactConfig, ExactLlama

    fused.usable.cache_clear()
    monkeypatch.setattr(fused, "_fused_instructions", lambda: ["_residual: vfmadd231sd"])
    try:
        config = CONFIGS["llama-mha"]
        model = ExactLlama(ExactConfig.from_hf(config), random_weights(config), MAX_POSITIONS)
        assert "torch kernel set" in model.kernel_summary()
        assert record(model) == EXPECTED["llama-mha"]
    finally:
        fused.usable.cache_clear()


@needs_compiled
@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "parallel"])
@pytest.mark.parametrize("name", ["pycoder-23m", *CONFIGS])
def test_the_fused_output_layer_gives_the_torch_paths_integer_logits(name: str, parallel: bool) -> None:
    with row_launches(parallel):
        _the_fused_output_layer_gives_the_torch_paths_integer_logits(name)


def _the_fused_output_layer_gives_the_torch_paths_integer_logits(name: str) -> None:
    model = load(name)
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(37, model.config.hidden_size, generator=g, dtype=torch.float64)
    hidden *= torch.tensor(10.0, dtype=torch.float64) ** torch.randint(-2, 3, (37, 1), generator=g)
    hidden[0] = 0.0
    expected = rint_(model.logits_before_rounding(hidden).clamp_(-RINT_LIMIT, RINT_LIMIT)).to(torch.int64)
    assert torch.equal(model.logits(hidden), expected)
    assert torch.equal(model.logits(hidden[1:2]), expected[1:2])  # one row: the streamed product
    assert torch.equal(model.logits(hidden[1:3]), expected[1:3])  # two rows: four digit rows, streamed too
    assert torch.equal(model.logits(hidden[:32]), expected[:32])  # streamed where the float32 pieces would not be
    flat = torch.full((1, model.config.hidden_size), 2.5, dtype=torch.float64)  # every element corrected
    assert torch.equal(model.logits(flat),
                       rint_(model.logits_before_rounding(flat).clamp_(-RINT_LIMIT, RINT_LIMIT)).to(torch.int64))


@contextlib.contextmanager
def step_by_step() -> Iterator[None]:
    """Every layer run step by step, as under the op audit (an observer is listening)."""
    def listen(name: str, operands: tuple[torch.Tensor, ...]) -> None:
        assert name != "fused.cached_layer"

    dispatch.observers.append(listen)
    try:
        yield
    finally:
        dispatch.observers.remove(listen)


@needs_compiled
@pytest.mark.parametrize("name", ["pycoder-23m", *CONFIGS])
def test_a_layer_of_a_few_cached_rows_in_one_launch_equals_the_layer_step_by_step(name: str) -> None:
    model = load(name)
    g = torch.Generator().manual_seed(11)
    vocab = model.config.vocab_size
    contexts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (1, 9, 40, 23)]
    cache = model.allocate_cache(4, 64)
    model.prefill(contexts, cache, [0, 1, 2, 3])
    for rows, positions in [(1, 1), (1, 3), (2, 1), (2, 4), (3, 2), (4, 1), (1, 17), (4, 8), (2, 17)]:
        row_ids = torch.tensor([r for r in (3, 0, 2, 1)[:rows] for _ in range(positions)])
        at = torch.cat([cache.lengths[r] + torch.arange(positions) for r in (3, 0, 2, 1)[:rows]])
        tokens = torch.randint(0, vocab, (rows * positions,), generator=g)
        fast_cache, steps_cache = (KVCache([k.clone() for k in cache.keys], [v.clone() for v in cache.values],
                                           cache.lengths.clone()) for _ in range(2))
        with mock.patch.object(fused, "cached_layer", wraps=fused.cached_layer) as one_launch:
            fast = model.verify(tokens, fast_cache, row_ids, at)
        streamed = all(rows * positions <= fused.streamed_rows(linear.int8_gemm)  # larger ones go to a GEMM
                       for linear in model.layers[0].linears())
        assert one_launch.call_count == (model.config.num_layers if streamed else 0)
        with step_by_step():
            steps = model.verify(tokens, steps_cache, row_ids, at)
        assert torch.equal(fast, steps), (rows, positions)
        assert all(torch.equal(a, b) for a, b in zip(fast_cache.keys + fast_cache.values,
                                                     steps_cache.keys + steps_cache.values, strict=True))


@needs_compiled
def test_the_op_audit_refuses_a_layer_in_one_launch_it_cannot_look_into() -> None:
    from cascade.codec.exact.audit import OpAudit

    model = load("llama-mha")
    cache = model.allocate_cache(1, 16)
    model.prefill([[1, 2, 3]], cache, [0])
    with OpAudit() as audit:
        model.step(torch.tensor([4]), cache)
    assert "fused.cached_layer" not in audit.calls and not audit.violations
    with OpAudit() as audit:
        fused.cached_layer(np.zeros((1, 48)), np.ones(1), np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64),
                           cache.keys[0], cache.values[0], model.kernels._layer_arrays(model.layers[0]),
                           *model.kernels._tables, 3, 8.0, 8.0, 1e-6, 1.0, 1024.0)
    assert audit.violations == {"fused.cached_layer: not a reviewed kernel"}


@needs_compiled
def test_a_second_reading_with_this_machines_root_runs_every_layer_step_by_step() -> None:
    from cascade.codec.exact import root

    model = load("llama-mha")
    cache = model.allocate_cache(1, 16)
    model.prefill([[1, 2, 3]], cache, [0])
    with mock.patch.object(fused, "cached_layer", wraps=fused.cached_layer) as one_launch:
        with root.machine():
            model.step(torch.tensor([4]), cache)
        assert one_launch.call_count == 0  # the compiled layer takes IEEE's root, not this machine's
        model.step(torch.tensor([5]), cache)
        assert one_launch.call_count == model.config.num_layers
