"""The op audit: the decision path of every model of the test matrix (prefill, decode steps through
the KV cache, logits, frequency and escape tables) runs only reviewed aten ops, dtypes and argument forms."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cascade.codec.exact import dispatch, frequencies
from cascade.codec.exact.audit import ALLOWED, KERNELS, OpAudit, allow_list_markdown, cast_list_markdown
from cascade.codec.exact.frequencies import escape_tables, frequency_tables
from cascade.codec.exact.grid import BYTE_TERMS

from tests.unit.codec.numerics_matrix import load, model_names, record

ARCHITECTURE = Path(__file__).resolve().parents[3] / "docs" / "architecture.md"


@pytest.mark.parametrize("kernels", ["fast", "reference"])
@pytest.mark.parametrize("name", model_names())
def test_the_decision_path_runs_only_reviewed_ops(name: str, kernels: str) -> None:
    model = load(name, kernels=kernels)
    with OpAudit(model.device) as audit:
        record(model)
        hidden = model.prefill([[1, 2, 3, 4, 5]])
        logits = model.logits(hidden)
        model.logits(hidden[-2:])  # two rows: the streamed output layer
        escape_tables(logits, frequency_tables(logits, 3, 32)[0])
    assert not audit.violations, sorted(audit.violations)
    products = audit.calls.get("aten.mm.default", 0) + audit.calls.get("aten._int_mm.default", 0)
    attention = "fused.attend_cached" if model.kernels.name == "compiled" else "aten.bmm.default"  # prefill's
    assert products > 0 and audit.calls.get(attention, 0) > 0
    if kernels == "reference":
        assert "aten._int_mm.default" not in audit.calls and "fused.attend_cached" not in audit.calls
    elif model.kernels.name == "compiled":
        # the int8 GEMM's three digits and their recombination
        unused = set() if model.lm_head.int8_gemm else {"fused.norm_digits", "fused.digit_logits"}
        missing = [name for name in KERNELS if name.startswith(("fused.", "frequencies."))
                   and name not in audit.calls and name not in unused]
        assert not missing


def test_the_torch_escape_tables_a_gpu_runs_use_only_reviewed_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """Off the CPU the escape tables (container version 4) are torch int64 ops, not the compiled loop."""
    monkeypatch.setattr(frequencies, "COMPILED", False)
    logits = torch.randint(-(20 << 16), 20 << 16, (3, 500), dtype=torch.int64)
    with OpAudit(logits.device) as audit:
        escape_tables(logits, frequency_tables(logits, 16, 32)[0])
    assert not audit.violations, sorted(audit.violations)
    assert audit.calls["aten.cumsum.default"] > 0 and "frequencies.compiled_escape_tables" not in audit.calls


def test_the_audit_catches_a_python_number_divisor_an_unreviewed_op_and_a_long_float32_sum() -> None:
    x = torch.ones(4, 2000, dtype=torch.float64)
    with OpAudit("cpu") as audit:
        _ = x / 3.0
        _ = x.exp()
        _ = x.to(torch.float32) @ torch.ones(2000, 3)
        _ = x.to(torch.float16)
    problems = "\n".join(sorted(audit.violations))
    assert "aten.div.Tensor: a Python number operand" in problems
    assert "aten.exp.default: not on the allow-list" in problems
    assert "aten.mm.default: a float32 product over 2000 > 1040 terms" in problems
    assert "conversion torch.float64 → torch.float16 is not reviewed" in problems


def test_docs_carry_the_allow_list_tables() -> None:
    text = ARCHITECTURE.read_text()
    stale = [line for line in (allow_list_markdown() + "\n" + cast_list_markdown()).splitlines() if line not in text]
    assert not stale, f"docs/architecture.md is out of date (python -m cascade.codec.exact.audit): {stale}"
    assert len(ALLOWED) > 20


def test_a_lowered_float32_matmul_precision_neither_changes_the_integers_nor_stays_changed() -> None:
    model = load("qwen2-gqa2-bias")
    tokens = [[5, 9, 200, 17, 3, 3, 41]]
    expected = model.logits(model.prefill(tokens))
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        assert torch.equal(model.logits(model.prefill(tokens)), expected)
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision(before)


def test_only_a_reviewed_host_step_may_leave_the_audited_device_and_its_ops_are_still_checked() -> None:
    """``root.machine_root`` takes a GPU's roots on the host; the audit lets exactly that step's
    tensors be on the CPU (``dispatch.host_step``) and still checks its ops."""
    x = torch.ones(3, dtype=torch.float64)
    with OpAudit("meta") as audit:
        _ = torch.sqrt(x)
    assert audit.violations == {"aten.sqrt.default: a tensor on cpu, not meta"}
    with OpAudit("meta") as audit, dispatch.host_step("root.machine_root",
                                                            torch.empty(3, dtype=torch.float64, device="meta")):
        _ = torch.sqrt(x)
        _ = x.exp()
    assert audit.violations == {"aten.exp.default: not on the allow-list"}
    assert not dispatch.on_host()


def test_the_audit_checks_the_value_bounds_its_reasons_state() -> None:
    """A cast to int8 of a value past ±127, a float32 GEMM of non-integers, a float64 product that may
    reach 2**53, an attention-cache product past its bound and an output layer's digit sums that may
    overflow are refused, although op and dtype are reviewed."""
    with OpAudit("cpu") as audit:
        _ = torch.tensor([[3.0, -200.0]], dtype=torch.float64).to(torch.int8)
        _ = torch.full((2, 4), 0.5, dtype=torch.float64).to(torch.float32) @ torch.ones(4, 3)
        big = torch.full((1, 2, 8), float(2**26), dtype=torch.float64)
        _ = big @ big.transpose(-1, -2)
        cache = torch.full((1, 1, 4, 8), 2**30, dtype=torch.int32)
        new = torch.zeros(1, 1, 8, dtype=torch.float64)
        dispatch.report("fused.attend_cached", torch.full((1, 1, 8), float(2**24), dtype=torch.float64), new, new,
                        cache, torch.zeros_like(cache))
        wide = BYTE_TERMS + 1
        dispatch.report("fused.byte_product", torch.zeros(2, wide, dtype=torch.int8),
                        torch.zeros(1, wide, dtype=torch.int8), torch.zeros(1, wide, dtype=torch.int64),
                        torch.zeros(1, wide, dtype=torch.int64), torch.zeros(1, dtype=torch.int64))
        dispatch.report("fused.byte_product", torch.zeros(2, 8, dtype=torch.int8), torch.zeros(1, 8, dtype=torch.int8),
                        torch.zeros(1, 8, dtype=torch.int64), torch.full((1, 8), 300, dtype=torch.int64),
                        torch.ones(1, dtype=torch.int64))
    problems = "\n".join(sorted(audit.violations))
    assert f"fused.byte_product: a digit sum over {BYTE_TERMS + 1} > {BYTE_TERMS} terms" in problems
    assert "fused.byte_product: digit corrections: magnitude 300 > 128" in problems
    assert "conversion torch.float64 → torch.int8: magnitude 200 > 127" in problems
    assert "conversion torch.float64 → torch.float32: not integers" in problems
    assert "aten.bmm.default: float64 products: |a|·|b|·8" in problems
    assert "fused.attend_cached: q·k: |a|·|b|·8" in problems
