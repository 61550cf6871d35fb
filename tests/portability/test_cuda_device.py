"""The device dimension of the portability matrix (runs where a CUDA GPU is present, skipped
otherwise): the exact model on the GPU computes the recorded exact-llama-1 digests bit for bit,
touches only reviewed ops with every tensor on the GPU (RMSNorm's roots included: CUDA's float64
square root is the correctly rounded one the model computes with, ``codec.exact.root``), and
reproduces the drift known answer, so containers cross between CPU and GPU services; its decode passes
replayed as CUDA graphs compute what they compute launched op by op."""

from __future__ import annotations

import json

import pytest
import torch
from cascade.codec.exact.audit import OpAudit
from cascade.codec.exact.graphs import GraphedVerify
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


def test_replayed_cuda_graphs_compute_the_passes_launched_op_by_op() -> None:
    """Each pass shape runs eagerly, then is captured and replayed: the hidden states equal ``verify``'s
    on a second cache bit for bit, every time (a draft of 2 pads to 4 queries, one token to 1)."""
    model = load("pycoder-23m", device="cuda")
    plain, graphed_cache = (model.allocate_cache(2, 96) for _ in range(2))
    for cache in (plain, graphed_cache):
        model.prefill([list(range(100, 140)), list(range(200, 230))], cache, [0, 1])
    graphed = GraphedVerify(model)
    lengths = [40, 30]
    for step in range(6):
        drafts = [[7 + step, 9], []] if step % 2 else [[], [11 + step]]
        tokens, rows, positions = [], [], []
        for row, (length, draft) in enumerate(zip(lengths, drafts, strict=True)):
            tokens += [3 + step, *draft]
            rows += [row] * (1 + len(draft))
            positions += range(length, length + 1 + len(draft))
        expected = model.verify(torch.tensor(tokens, device="cuda"), plain, torch.tensor(rows, device="cuda"),
                                torch.tensor(positions, device="cuda"))
        assert torch.equal(graphed(tokens, rows, positions, graphed_cache), expected)
        lengths = [n + 1 for n in lengths]
    assert graphed.captures >= 1 and graphed.replays >= 2
