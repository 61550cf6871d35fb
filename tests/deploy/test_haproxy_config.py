"""``deploy/haproxy/haproxy.cfg`` is valid for the HAProxy on this machine, with and without an API key,
and it refuses to start without the replicas it needs (it runs for real in tests/integration/test_replicas.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "haproxy" / "haproxy.cfg"
HAPROXY = shutil.which("haproxy")
pytestmark = pytest.mark.skipif(HAPROXY is None, reason="haproxy is not installed: `apt-get install haproxy`")


def _check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    assert HAPROXY is not None
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CASCADE_")}
    return subprocess.run([HAPROXY, "-c", "-f", str(CONFIG)], env={**clean, **env}, capture_output=True, text=True,
                          timeout=30)


@pytest.mark.parametrize("api_key", ["", "s3cret"])
def test_the_balancer_config_is_valid(api_key: str) -> None:
    result = _check({"CASCADE_REPLICA_1": "10.0.0.1:8000", "CASCADE_REPLICA_2": "10.0.0.2:8000",
                     "CASCADE_LB_PORT": "8080", "CASCADE_API_KEY": api_key})
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_balancer_config_needs_its_replicas() -> None:
    result = _check({"CASCADE_LB_PORT": "8080"})
    assert result.returncode != 0 and "expects <name> and <addr>" in result.stdout + result.stderr
