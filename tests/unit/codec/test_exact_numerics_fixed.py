"""``exact-llama-1`` is frozen: the model must reproduce, bit for bit, the logits and frequency tables
the release that introduced it computed on the test matrix (pycoder-23m and random-weight Llama/Qwen2
models with grouped-query attention), or its containers stop decoding — and, with the correctly
rounded square root it computes with, every hidden state (``numerics_matrix``: torch's root, which
earlier releases computed with, differs between machines)."""

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


INTEGERS = ("prefill.logits", "prefill.ids", "prefill.cdf", "decode.logits")


@pytest.mark.parametrize("name", ["pycoder-23m", "llama-gqa4-tied-linear"])
def test_this_machines_torch_square_root_computes_the_recorded_integers(name: str) -> None:
    """The root earlier releases made containers with on this machine gives the recorded integers too."""
    got = record(load(name), machine_root=True)
    assert {k: got[k] for k in INTEGERS} == {k: EXPECTED[name][k] for k in INTEGERS}
