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


def test_after_install_the_samplers_expansion_keeps_float_and_int32_values() -> None:
    from vllm.platforms import current_platform

    current_platform.register_triton_kernel_overrides()
    draft_sampling_fix.install()
    assert draft_sampling_fix.problems() == []
    assert draft_sampling_fix.is_installed()
    assert draft_sampling_fix.install() is False  # idempotent
