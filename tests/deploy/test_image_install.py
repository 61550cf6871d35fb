"""The container image's install steps, run as a script in a fresh venv (no Docker engine here).

The CPU Dockerfile copies pyproject.toml, README.md, service/, clients/, models/ and
deploy/install.sh (+ pip-install.sh) into /opt/cascade and runs ``CASCADE_FLAVOUR=cpu sh
deploy/install.sh`` into a venv; this test does the same into a temporary folder and a new virtual
environment (a non-editable install, as in the image), then starts the installed ``cascade serve``
with the final image's environment and checks it serves, answers its healthcheck and stops cleanly
on SIGTERM. The image itself is built and run on a Docker engine by test_compose_smoke.py.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
# The venv holds torch and vLLM (~3.7 GB) and pip unpacks wheels beside it.
NEEDED_FREE_BYTES = 6 * 2**30


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


def _copy_like_the_image(target: Path) -> None:
    """The project files the CPU image copies into its WORKDIR (both stages; not ``--from`` copies,
    nor the build's extras under absolute paths: CA certificates, extra wheels)."""
    text = (REPO / "deploy/Dockerfile.cpu").read_text()
    for line in re.findall(r"^COPY (.+)$", text, re.M):
        *sources, dest = line.split()
        if line.startswith("--") or dest.startswith("/"):
            continue
        for source in sources:
            path, into = REPO / source, target / dest
            if dest.endswith("/"):
                into = into / path.name
            into.parent.mkdir(parents=True, exist_ok=True)
            if path.is_dir():
                shutil.copytree(path, into, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
            else:
                shutil.copy2(path, into)


def _remove_finished_sessions_venvs(tmp_path: Path) -> None:
    """Delete the venvs this test left in earlier pytest sessions' numbered folders (pytest keeps the
    last three): several GB each, they filled a CI machine's disk. A session still running holds its
    ``.lock`` file, and its folder is left alone."""
    session, test = tmp_path.parent, re.sub(r"\d+$", "", tmp_path.name)
    for earlier in session.parent.glob("pytest-*"):
        if earlier != session and not (earlier / ".lock").exists():
            for leftover in earlier.glob(f"{test}*/venv"):
                shutil.rmtree(leftover, ignore_errors=True)


@pytest.mark.timeout(1200)
def test_cpu_image_install_steps_give_a_working_service(tmp_path: Path) -> None:
    _remove_finished_sessions_venvs(tmp_path)
    free = shutil.disk_usage(tmp_path).free
    if free < NEEDED_FREE_BYTES:
        pytest.skip(f"a venv with torch and vLLM needs {NEEDED_FREE_BYTES / 2**30:.0f} GiB free; "
                    f"{tmp_path} has {free / 2**30:.1f} GiB")
    app, venv = tmp_path / "opt-cascade", tmp_path / "venv"
    try:
        _install_and_serve(tmp_path, app, venv)
    finally:  # the tests after this one need the disk
        shutil.rmtree(venv, ignore_errors=True)


def _install_and_serve(tmp_path: Path, app: Path, venv: Path) -> None:
    app.mkdir()
    _copy_like_the_image(app)
    assert {p.name for p in app.iterdir()} >= {"pyproject.toml", "service", "clients", "models", "deploy"}
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    # Not tests/conftest.py's PYTHONPATH (this checkout's sources): the installed package must serve alone.
    outside = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    installed = subprocess.run(["sh", "deploy/install.sh"], cwd=app, capture_output=True, text=True, timeout=1100,
                               env={**outside, "CASCADE_FLAVOUR": "cpu", "PYTHON": str(python),
                                    "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1"})
    assert installed.returncode == 0, installed.stderr[-3000:]
    assert "cascade installed on vLLM 0.32.0" in installed.stdout
    assert "editable" not in subprocess.run([str(python), "-m", "pip", "show", "cascade-gateway"],
                                            capture_output=True, text=True).stdout.lower()
    leftovers = subprocess.run([str(python), "-m", "pip", "list", "--format=freeze"], capture_output=True,
                               text=True).stdout
    assert not re.search(r"^(torchvision|torchaudio|torchcodec)==", leftovers, re.M)

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
