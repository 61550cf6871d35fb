"""Start and stop real OpenAI-compatible servers for the HTTP benchmarks: ``cascade serve`` and vLLM's own
``vllm.entrypoints.openai.api_server``, each in its own process group so that stopping it also stops the
engine processes it spawned (a shared machine must not keep orphaned engines).

Readiness is polled (``/ready`` for Cascade, ``/health`` for vLLM), never waited for blindly: engine
start-up takes from half a minute to several minutes, depending on the load others put on the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
IOMP = REPO / ".venv" / "lib" / "libiomp5.so"


@dataclass
class Server:
    """A running server, how to reach it and where it logs."""

    name: str
    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_env(python: str = sys.executable) -> dict[str, str]:
    """The environment engines get on the CPU: Intel OpenMP preloaded (vLLM's speculative decoding is slow
    without it) when the venv that runs ``python`` ships it, and this checkout's sources first."""
    env = dict(os.environ)
    iomp = Path(python).resolve().parents[1] / "lib" / "libiomp5.so"
    for candidate in (Path(sys.prefix) / "lib" / "libiomp5.so", iomp, IOMP):
        if candidate.is_file() and "libiomp5" not in env.get("LD_PRELOAD", ""):
            env["LD_PRELOAD"] = " ".join(filter(None, [str(candidate), env.get("LD_PRELOAD")]))
            break
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "service"), str(REPO / "clients"),
                                         *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def start_server(name: str, command: list[str], ready_path: str, port: int, log_dir: Path,
                 timeout: float = 900, env: dict[str, str] | None = None) -> Server:
    """Launch ``command`` (which must listen on ``port``) in a new process group; return once
    ``ready_path`` answers 200. A server that exits or never gets ready is stopped and reported with
    the end of its log."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, cwd=REPO, env=env or cpu_env(), stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(name, f"http://127.0.0.1:{port}", process, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}:\n{server.log_tail()}")
        try:
            if httpx.get(server.base_url + ready_path, timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(1)
    stop_server(server)
    raise RuntimeError(f"{name} not ready after {timeout:.0f}s:\n{server.log_tail()}")


def stop_server(server: Server, timeout: float = 60) -> None:
    """SIGTERM to the server's process group (the server and its engine processes), SIGKILL after
    ``timeout`` seconds."""
    try:
        os.killpg(server.process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.process.wait(timeout=timeout)
    with contextlib.suppress(ProcessLookupError):  # engine processes that outlived the server
        os.killpg(server.process.pid, signal.SIGKILL)
    server.process.wait()


def start_cascade(model: str | None, port: int, log_dir: Path, extra: list[str]) -> Server:
    """``python -m cascade serve`` (``model`` None: the embedded default model)."""
    command = [sys.executable, "-m", "cascade", "serve", "--port", str(port), *extra]
    if model is not None:
        command += ["--model", model]
    return start_server("cascade", command, "/ready", port, log_dir)


def start_vllm(model_path: str, served_name: str, port: int, log_dir: Path, engine: dict[str, Any],
               speculative: dict[str, Any] | None, python: str = sys.executable, label: str = "vllm") -> Server:
    """vLLM's own OpenAI server with the engine arguments ``engine`` (``--flag value``; True: a bare
    flag) and, if given, ``--speculative-config``. ``python``: another interpreter (a venv with extra
    packages, e.g. Arctic Inference for the ``suffix`` method)."""
    command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path,
               "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port)]
    for flag, value in engine.items():
        command += [f"--{flag}"] if value is True else [f"--{flag}", str(value)]
    if speculative is not None:
        command += ["--speculative-config", json.dumps(speculative)]
    return start_server(label, command, "/health", port, log_dir, env=cpu_env(python))
