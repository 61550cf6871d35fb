"""Start the real gateway (real vLLM engine on the CPU, default model) once per test session."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from cascade.predict.datastore_corpus import default_cache_dir

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
API_KEY = "test-key-123"
MODEL = "pycoder-23m"


@dataclass
class Service:
    """A running gateway and how to reach it."""

    base_url: str
    api_key: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def client(self, **kwargs: object) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, headers=self.headers, timeout=120, **kwargs)  # type: ignore[arg-type]

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_service(tmp: Path, extra_args: list[str], env_extra: dict[str, str] | None = None,
                  timeout: float = 300) -> Service:
    """Launch ``python -m cascade serve`` and wait for ``/ready``.

    In its own process group (``stop_service`` signals the group) but in the tests' session: with the
    kernel's autogroup scheduling, a service in a session of its own on a 2-core machine left its
    gateway seconds without CPU while vLLM's engine core spun during a generation (``/metrics``
    answered in 4–8 s), so a 1,000-token request finished before a test could see it running."""
    port = free_port()
    log_path = tmp / f"service-{port}.log"
    # every service of the run shares the user's code datastores: built once per tokenizer, not per service
    datastores = {"CASCADE_PREDICTION_DATASTORE_DIR": str(default_cache_dir())}
    env = {**os.environ, **datastores, "CASCADE_HOME": str(tmp / "home"), **(env_extra or {})}
    args = [sys.executable, "-m", "cascade", "serve", "--port", str(port), "--api-key", API_KEY, *extra_args]
    with log_path.open("wb") as log:
        process = subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   process_group=0)
    service = Service(f"http://127.0.0.1:{port}", API_KEY, process, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"service exited with {process.returncode}:\n{service.log_tail()}")
        try:
            if httpx.get(f"{service.base_url}/ready", headers=service.headers, timeout=2).status_code == 200:
                return service
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop_service(service)
    raise RuntimeError(f"service not ready after {timeout}s:\n{service.log_tail()}")


def stop_service(service: Service, timeout: float = 60, reap: bool = True) -> int:
    """SIGTERM, then wait; returns the exit code. With ``reap``, whatever of its process group outlives
    it (an engine still starting when a timed-out start was stopped) is killed, so no test leaves
    engines behind; a test of the service's own shutdown looks for orphans without it."""
    if service.process.poll() is None:
        service.process.send_signal(signal.SIGTERM)
        try:
            service.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            service.process.kill()
            service.process.wait()
    if reap:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(service.process.pid, signal.SIGKILL)
    return int(service.process.returncode)


@pytest.fixture(scope="session")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    svc = start_service(tmp_path_factory.mktemp("svc"), [])
    yield svc
    stop_service(svc)


@pytest.fixture(scope="session")
def openai_client(service: Service):  # type: ignore[no-untyped-def]
    from openai import OpenAI

    return OpenAI(base_url=service.base_url + "/v1", api_key=service.api_key, max_retries=0, timeout=120)


def metric_sum(service: Service, name: str) -> float:
    """Metric ``name`` read from ``/metrics``, summed over its label sets (if it has any)."""
    r = httpx.get(f"{service.base_url}/metrics", headers=service.headers, timeout=10)
    assert r.status_code == 200, f"/metrics answered {r.status_code}: {r.text[:300]}"
    return sum(float(line.rsplit(" ", 1)[1]) for line in r.text.splitlines()
               if line.startswith((f"{name}{{", f"{name} ")))


def unfinished_engine_requests(service: Service) -> float:
    """Sum of ``cascade_engine_unfinished_requests`` over engines."""
    return metric_sum(service, "cascade_engine_unfinished_requests")


def wait_until_idle(service: Service, timeout: float = 30) -> float:
    """Poll until no engine holds a request; returns the last count seen."""
    deadline = time.monotonic() + timeout
    count = unfinished_engine_requests(service)
    while count and time.monotonic() < deadline:
        time.sleep(0.2)
        count = unfinished_engine_requests(service)
    return count


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.1,
             detail: Callable[[], object] | None = None) -> T:
    """Poll ``predicate`` every ``interval`` seconds until it returns something truthy, and return that.
    After ``timeout`` seconds fail the test naming ``what`` (and ``detail()``, or the last value seen).
    Tests wait on conditions this way, never with a bare ``sleep``: how fast this CPU is must not matter."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            seen = detail() if detail is not None else value
            pytest.fail(f"timed out after {timeout:g}s waiting for {what} (last seen: {seen!r})")
        time.sleep(interval)


async def wait_for_async(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.1,
                         detail: Callable[[], object] | None = None) -> T:
    """``wait_for`` from inside an event loop: the (blocking) predicate runs in a thread, so the loop's
    own requests keep going while it polls."""
    return await asyncio.to_thread(wait_for, predicate, timeout, what, interval, detail)


def live_state(service: Service) -> dict[str, Any]:
    """``GET /ops/live-state``: per-engine live request state and the gateway's counters."""
    r = httpx.get(f"{service.base_url}/ops/live-state", headers=service.headers, timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json())


def engine_aborts(service: Service) -> int:
    """How many engine requests the gateway has aborted since it started (clients that left early)."""
    return int(live_state(service)["gateway"]["engine_aborts"])


def wait_for_aborts(service: Service, before: int, dropped: int, timeout: float = 120) -> None:
    """Wait until the gateway counted ``dropped`` more engine aborts than ``before`` and no engine holds
    a request, then check it counted exactly that many. A dropped request that finished on its own
    instead adds no abort, so it fails here."""
    def done() -> bool:
        return engine_aborts(service) - before >= dropped and unfinished_engine_requests(service) == 0

    wait_for(done, timeout, f"{dropped} engine abort(s) and an idle engine after the client(s) left",
             detail=lambda: {"aborts_added": engine_aborts(service) - before,
                             "unfinished": unfinished_engine_requests(service)})
    assert engine_aborts(service) - before == dropped, "more engine requests were aborted than clients left"
