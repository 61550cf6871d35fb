"""The container image's install steps, run as a script in a fresh venv (no Docker engine here).

The CPU Dockerfile copies pyproject.toml, README.md, service/, clients/, models/ and
deploy/install.sh (+ pip-install.sh) into /opt/cascade and runs ``CASCADE_FLAVOUR=cpu sh
deploy/install.sh`` into a venv; the deploy tier does the same into a temporary folder and a new
virtual environment (a non-editable install, as in the image), in the background from its first test
on (image_install.py). This test, the session's last, checks that install, then starts the installed
``cascade serve`` with the final image's environment and checks it serves, answers its healthcheck
and stops cleanly on SIGTERM. The image itself is built and run on a Docker engine by test_compose_smoke.py.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.deploy.image_install import ImageInstall, outside_env
from tests.integration.conftest import free_port

REPO = Path(__file__).resolve().parents[2]


def _final_stage(dockerfile: str) -> list[tuple[str, str]]:
    """The instructions (name, arguments) of a Dockerfile's last stage, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (REPO / dockerfile).read_text())
    instructions = [(m.group(1).upper(), m.group(2)) for m in re.finditer(r"^([A-Za-z]+)\s+(.*)$", text, re.M)]
    last_from = max(i for i, (name, _) in enumerate(instructions) if name == "FROM")
    return instructions[last_from + 1:]


def _image_env(dockerfile: str, workdir: Path, scratch: Path) -> dict[str, str]:
    """The final image's ``ENV``, with its WORKDIR at ``workdir`` and its other absolute paths under
    ``scratch`` (PATH and LD_PRELOAD, which name the image's venv, are this test's own)."""
    env: dict[str, str] = {}
    for name, arguments in _final_stage(dockerfile):
        if name == "ENV":
            env.update((k, v) for k, v in re.findall(r"(\w+)=(\S+)", arguments)
                       if k not in ("PATH", "LD_PRELOAD"))
    for key, value in env.items():
        if value.startswith("/opt/cascade"):
            env[key] = value.replace("/opt/cascade", str(workdir), 1)
        elif value.startswith("/"):
            env[key] = str(scratch / value.lstrip("/"))
    return env


@pytest.mark.runs_last
@pytest.mark.timeout(1200)
def test_cpu_image_install_steps_give_a_working_service(image_install: ImageInstall, tmp_path: Path) -> None:
    if image_install.skip_reason:
        pytest.skip(image_install.skip_reason)
    try:
        _check_and_serve(image_install, tmp_path)
    finally:
        image_install.remove()


def _check_and_serve(install: ImageInstall, tmp_path: Path) -> None:
    app, venv, python = install.app, install.venv, install.python
    assert {p.name for p in app.iterdir()} >= {"pyproject.toml", "service", "clients", "models", "deploy"}
    installed = install.result(timeout=1100)
    assert installed.returncode == 0, installed.stderr[-3000:]
    assert "cascade installed on vLLM 0.32.0" in installed.stdout
    assert "editable" not in subprocess.run([str(python), "-m", "pip", "show", "cascade-gateway"],
                                            capture_output=True, text=True).stdout.lower()
    leftovers = subprocess.run([str(python), "-m", "pip", "list", "--format=freeze"], capture_output=True,
                               text=True).stdout
    assert not re.search(r"^(torchvision|torchaudio|torchcodec)==", leftovers, re.M)
    outside = outside_env()

    port = free_port()
    image_env = _image_env("deploy/Dockerfile.cpu", app, tmp_path / "root")
    assert Path(image_env["CASCADE_MODEL"]).is_dir()
    env = {**{k: v for k, v in outside.items() if not k.startswith("CASCADE_")}, **image_env,
           "CASCADE_HOST": "127.0.0.1", "CASCADE_PORT": str(port), "CASCADE_ENABLE_PREDICTIONS": "false",
           "CASCADE_ENABLE_CODEC": "false"}
    server = subprocess.Popen([str(venv / "bin" / "cascade"), "serve"], cwd=app, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert server.poll() is None, server.stderr.read().decode()[-3000:] if server.stderr else ""
            try:
                if httpx.get(f"{url}/ready", timeout=5).status_code == 200:  # the image's HEALTHCHECK
                    break
            except httpx.TransportError:
                pass
            time.sleep(1)
        else:
            pytest.fail("the installed service did not become ready")
        reply = httpx.post(f"{url}/v1/completions", timeout=60,
                           json={"model": "pycoder-23m", "prompt": "def add(a, b):\n", "max_tokens": 4})
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 4
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(120) == 0
