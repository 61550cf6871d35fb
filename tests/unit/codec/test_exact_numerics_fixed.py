"""``exact-llama-1`` is frozen: the model must reproduce, bit for bit, the hidden states, logits and
frequency tables the release that introduced it computed on the test matrix (pycoder-23m and
random-weight Llama/Qwen2 models with grouped-query attention), or its containers stop decoding."""

from __future__ import annotations

import json

import pytest

from tests.unit.codec.numerics_matrix import DIGESTS, load, model_names, record

EXPECTED = json.loads(DIGESTS.read_text())


@pytest.mark.parametrize("kernels", ["fast", "reference"])
@pytest.mark.parametrize("name", model_names())
def test_the_model_reproduces_the_exact_llama_1_digests(name: str, kernels: str) -> None:
    """Both kernel sets (int8 GEMM where the host sums it exactly + integer-cache attention, and the
    release's float32 GEMMs + float64 bmm) compute the recorded integers."""
    assert record(load(name, kernels=kernels)) == EXPECTED[name]
