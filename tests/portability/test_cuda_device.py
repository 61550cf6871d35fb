"""The device dimension of the portability matrix (runs where a CUDA GPU is present, skipped
otherwise): the exact model on the GPU computes the recorded exact-llama-1 digests bit for bit,
touches only reviewed ops with every tensor on the GPU (RMSNorm's roots included: CUDA's float64
square root is the correctly rounded one the model computes with, ``codec.exact.root``), and
reproduces the drift known answer, so containers cross between CPU and GPU services."""

from __future__ import annotations

import json

import pytest
import torch
from cascade.codec.exact.audit import OpAudit
from cascade.codec.exact.known_answer import check_known_answer, reference_path
from cascade.engine.fingerprint import model_fingerprint

from tests.unit.codec.numerics_matrix import DIGESTS, PYCODER, load, model_names, record

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")


@pytest.mark.parametrize("name", model_names())
def test_the_gpu_computes_the_recorded_exact_llama_1_digests(name: str) -> None:
    model = load(name, device="cuda")
    with OpAudit(model.device) as audit:
        got = record(model)
    assert not audit.violations, sorted(audit.violations)
    assert "root.machine_root" not in audit.calls  # no host step: the GPU takes its own roots
    assert got == json.loads(DIGESTS.read_text())[name]


def test_the_gpu_reproduces_the_cpu_known_answer() -> None:
    check_known_answer(load("pycoder-23m", device="cuda"), reference_path(model_fingerprint(str(PYCODER))))
