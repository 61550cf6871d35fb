"""The portability matrix: the same texts under different thread counts and instruction sets give
bit-identical logits, frequency tables and payloads (and each configuration checks, inside, that a
text alone, among 63 others and through decode steps gives the same integers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(1800)
PROBE = Path(__file__).with_name("probe.py")
_SETUP = ("threads", "isa", "kernels")
CONFIGS = {
    "1 thread, best ISA": {"CASCADE_PROBE_THREADS": "1"},
    "2 threads, oneDNN SSE4.1": {"CASCADE_PROBE_THREADS": "2", "ONEDNN_MAX_CPU_ISA": "SSE41"},
    "2 threads, ATen default kernels": {"CASCADE_PROBE_THREADS": "2", "ATEN_CPU_CAPABILITY": "default"},
    "2 threads, ATen AVX2, oneDNN AVX2": {"CASCADE_PROBE_THREADS": "2", "ATEN_CPU_CAPABILITY": "avx2",
                                          "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "2 threads, reference kernels": {"CASCADE_PROBE_THREADS": "2", "CASCADE_PROBE_KERNELS": "reference"},
}


def _run(extra: dict[str, str]) -> dict[str, Any]:
    env = {**os.environ, **extra, "OMP_NUM_THREADS": extra["CASCADE_PROBE_THREADS"]}
    done = subprocess.run([sys.executable, str(PROBE)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, Any]]:
    return {name: _run(env) for name, env in CONFIGS.items()}


def test_configurations_really_differ(results: dict[str, dict[str, Any]]) -> None:
    assert {r["threads"] for r in results.values()} == {1, 2}
    assert len({r["isa"] for r in results.values()}) >= 2
    assert len({r["kernels"] for r in results.values()}) >= 2


def test_every_configuration_computes_the_same_integers_and_bytes(results: dict[str, dict[str, Any]]) -> None:
    reference = {k: v for k, v in next(iter(results.values())).items() if k not in _SETUP}
    for name, result in results.items():
        assert {k: v for k, v in result.items() if k not in _SETUP} == reference, name


def test_every_configuration_reproduces_the_known_answer_and_the_recorded_exact_llama_1_digests(
        results: dict[str, dict[str, Any]]) -> None:
    for name, result in results.items():
        assert result["known_answer"] == "reproduced", name
        assert all(result["exact_llama_1_random_models"].values()), (name, result["exact_llama_1_random_models"])
