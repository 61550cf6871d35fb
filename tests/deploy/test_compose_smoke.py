"""The compose stack on a real Docker engine: ``./dev compose-smoke --quick`` (deploy/compose_smoke.py)
builds the CPU image from deploy/Dockerfile.cpu (reusing the engine's cached layers), starts the
compose file's CPU profile and checks the healthcheck, ``/ready``, a chat, a prediction, a codec
round trip and k-CBS through the published port, the non-root user writing ``CASCADE_HOME`` and
Prometheus scraping with the API key.

Gated twice, and the skip says which gate stopped it: it runs only where a Docker engine answers
(``docker info``) and ``CASCADE_TEST_COMPOSE=1`` is set. The opt-in is for CI's budget: measured
on this project's loaded 2-core machine, this variant took 4 min 17 s with the image's layers
cached, but a first build takes 7+ min more and a loaded machine stretched engine start-up to
12 min (vLLM pins every engine worker to core 0), on top of CI's ~20 minutes. The full smoke (a
fetched model surviving ``down && up``) is ``./dev compose-smoke`` by hand: docs/deployment.md
has its timings.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _engine_problem() -> str | None:
    docker = shutil.which("docker")
    if docker is None:
        return "no docker CLI on PATH"
    info = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=60)
    return None if info.returncode == 0 else "no Docker engine answers (docker info failed)"


@pytest.mark.timeout(3600)
def test_compose_cpu_profile_builds_and_serves_on_this_machines_docker_engine() -> None:
    problem = _engine_problem()
    if problem is not None:
        pytest.skip(f"{problem}: the compose stack did not run (start dockerd, then ./dev compose-smoke)")
    if os.environ.get("CASCADE_TEST_COMPOSE") != "1":
        pytest.skip("a Docker engine answers, but the compose stack runs only with CASCADE_TEST_COMPOSE=1 "
                    "(4-20+ min on this machine: over CI's budget)")
    result = subprocess.run([str(REPO / "dev"), "compose-smoke", "--quick"], cwd=REPO, capture_output=True,
                            text=True, timeout=3500)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    for step in ("chat (", "prediction:", "codec:", "k-CBS:", "Prometheus scraped /metrics with the key",
                 "compose-smoke: passed"):
        assert step in output, f"{step!r} missing from:\n{output[-3000:]}"
