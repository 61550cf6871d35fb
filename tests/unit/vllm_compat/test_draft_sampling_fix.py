"""The rejection sampler spreads each request's own temperature, top-k and top-p over its drafts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from cascade.vllm_compat import draft_sampling_fix  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 2, width=32), st.integers(0, 5)), min_size=1, max_size=8))
def test_reference_expansion_repeats_each_value_over_its_drafts(rows: list[tuple[float, int]]) -> None:
    values = torch.tensor([v for v, _ in rows], dtype=torch.float32)
    counts = [n for _, n in rows]
    cu = torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32)
    got = draft_sampling_fix.expand_batch_to_tokens(values, cu, sum(counts), replace_from=0, replace_to=1)
    want = [1.0 if v == 0 else float(torch.tensor(v, dtype=torch.float32)) for v, n in rows for _ in range(n)]
    assert got.dtype == torch.float32 and got.tolist() == want


def _vllm_cpu_expansion():  # type: ignore[no-untyped-def]
    """vLLM 0.32's expansion as its CPU build runs it: the C++ override of the Triton kernel."""
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    if not hasattr(torch.ops._C, "expand_kernel_impl"):
        pytest.skip("this vLLM build has no CPU expand kernel")
    from vllm.utils import cpu_triton_utils

    def expand(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):  # type: ignore[no-untyped-def]
        out = x.new_empty(num_tokens)
        cpu_triton_utils._expand_kernel_impl(out, x, cu_num_tokens, replace_from, replace_to)
        return out

    return expand


def test_the_probe_finds_vllms_cpu_expansion_broken_and_the_replacement_right() -> None:
    broken = _vllm_cpu_expansion()
    found = draft_sampling_fix.problems(broken)
    assert any("float32" in p for p in found) and any("int32" in p for p in found)
    assert draft_sampling_fix.problems(draft_sampling_fix.expand_batch_to_tokens) == []


def test_install_replaces_a_broken_expansion_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.sample import rejection_sampler

    monkeypatch.setattr(rejection_sampler, "expand_batch_to_tokens", _vllm_cpu_expansion())
    assert draft_sampling_fix.is_broken()
    assert draft_sampling_fix.install() is True
    assert draft_sampling_fix.problems() == [] and draft_sampling_fix.is_installed()
    assert draft_sampling_fix.install() is False


def test_install_leaves_a_correct_expansion_and_mask_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.sample import rejection_sampler

    def correct(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):  # type: ignore[no-untyped-def]
        return draft_sampling_fix.expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from, replace_to)

    def mask(logits, k, p):  # type: ignore[no-untyped-def]
        return logits

    monkeypatch.setattr(rejection_sampler, "expand_batch_to_tokens", correct)
    monkeypatch.setattr(rejection_sampler, "apply_top_k_top_p", mask)
    assert draft_sampling_fix.install() is False
    assert rejection_sampler.expand_batch_to_tokens is correct and rejection_sampler.apply_top_k_top_p is mask


def test_vllms_top_k_mask_raises_on_a_step_without_drafts_and_the_guard_does_not() -> None:
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    assert draft_sampling_fix.empty_step_fails(apply_top_k_top_p)
    guarded = draft_sampling_fix.skipping_empty_steps(apply_top_k_top_p)
    assert not draft_sampling_fix.empty_step_fails(guarded)
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    masked = guarded(logits.clone(), torch.tensor([2], dtype=torch.int32), None)
    assert masked.isinf().tolist() == [[True, False, True, False]]


def test_install_guards_a_mask_that_raises_on_an_empty_step_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    monkeypatch.setattr(rejection_sampler, "expand_batch_to_tokens", draft_sampling_fix.expand_batch_to_tokens)
    monkeypatch.setattr(rejection_sampler, "apply_top_k_top_p", apply_top_k_top_p)
    assert not draft_sampling_fix.is_installed()
    assert draft_sampling_fix.install() is True
    assert draft_sampling_fix.is_installed() and rejection_sampler.apply_top_k_top_p is not apply_top_k_top_p
    assert draft_sampling_fix.install() is False
