"""Two real replicas behind a real HAProxy (Debian's package, ``deploy/haproxy/haproxy.cfg``), run on this host.

One module, two replicas started once (predictions off: the codec and greedy requests are what
crosses replicas), HAProxy started as a plain process. Checked, in this order (the last test kills a
replica, so it runs last):

- a container made by one replica decompresses on the other, and both make the same bytes;
- one input spread over both replicas through the balancer makes the same container as the same
  pieces sent to one replica, and decompresses spread or whole;
- chat requests that share a prompt prefix land on one replica;
- with a replica killed mid-load, no request that had not started is lost (the balancer resends
  what had not reached a replica, the client what was refused or reset before any byte of its
  answer), and a codec stream cut by the death is an error to its client: the CLI says so and
  leaves no output file, never a short one.

HAProxy is a system package (``apt-get install haproxy``; README "Two commands"): without it this
module is skipped with that reason, loudly, rather than failing on a machine that cannot have it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
from cascade_client import CascadeClient, CascadeError

from tests.integration.conftest import (
    MODEL,
    REPO,
    Service,
    free_port,
    metric_sum,
    start_service,
    stop_service,
    wait_for,
)

HAPROXY = shutil.which("haproxy")
if HAPROXY is None:
    pytest.skip("haproxy is not installed: `apt-get install haproxy` (Debian) to run the replica tests",
                allow_module_level=True)

CONFIG = REPO / "deploy" / "haproxy" / "haproxy.cfg"
TEXT = (REPO / "service" / "cascade" / "codec" / "container.py").read_bytes()[:6000]
PIECE = 1500


@dataclass
class Balanced:
    """Two replicas and the balancer in front of them."""

    replicas: list[Service]
    url: str
    api_key: str
    haproxy: subprocess.Popen[bytes]
    log: Path

    def client(self, url: str | None = None, **kwargs: object) -> CascadeClient:
        return CascadeClient(url or self.url, self.api_key, timeout=300, **kwargs)  # type: ignore[arg-type]

    def codec_jobs(self, replica: Service) -> float:
        return metric_sum(replica, "cascade_codec_live_jobs")


def _start_haproxy(tmp: Path, replicas: list[Service]) -> tuple[subprocess.Popen[bytes], str, Path]:
    port = free_port()
    log = tmp / "haproxy.log"
    env = {**os.environ, "CASCADE_LB_PORT": str(port), "CASCADE_API_KEY": replicas[0].api_key,
           **{f"CASCADE_REPLICA_{i + 1}": r.base_url.removeprefix("http://") for i, r in enumerate(replicas)}}
    assert HAPROXY is not None
    with log.open("wb") as out:
        process = subprocess.Popen([HAPROXY, "-db", "-f", str(CONFIG)], env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    return process, f"http://127.0.0.1:{port}", log


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def _kill_replica(replica: Service) -> None:
    """SIGKILL the gateway and its engine processes at once: a machine or container that dies."""
    parent = psutil.Process(replica.process.pid)
    for process in [*parent.children(recursive=True), parent]:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    replica.process.wait(timeout=30)


@pytest.fixture(scope="module")
def balanced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Balanced]:
    tmp = tmp_path_factory.mktemp("replicas")
    # Both engines start at once. Predictions off (one engine each); the start-up self-test off: it
    # checks this machine's numerics against the reference machine's, which tests/unit/codec does,
    # while what crosses replicas here is checked by the replicas themselves, byte for byte.
    args = ["--no-enable-predictions", "--no-codec-selftest"]
    for i in (1, 2):
        (tmp / f"r{i}").mkdir()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        # Two engines starting at once on a loaded machine may take longer than one alone.
        futures = [pool.submit(start_service, tmp / f"r{i}", args, None, 600) for i in (1, 2)]
        concurrent.futures.wait(futures)
    replicas: list[Service] = [f.result() for f in futures if f.exception() is None]
    failed = [f.exception() for f in futures if f.exception() is not None]
    if failed:
        for started in replicas:
            stop_service(started)
        raise RuntimeError(f"a replica did not start: {failed[0]}") from failed[0]
    haproxy, url, log = _start_haproxy(tmp, replicas)
    setup = Balanced(replicas, url, replicas[0].api_key, haproxy, log)
    try:
        def both_up() -> bool:  # each replica answers through the balancer (its health check passed)
            seen = set()
            for _ in range(6):
                try:
                    r = httpx.get(f"{url}/ready", headers=replicas[0].headers, timeout=5)
                except httpx.HTTPError:
                    return False
                if r.status_code != 200:
                    return False
                seen.add(r.headers.get("x-cascade-replica"))
            return seen == {"replica1", "replica2"}

        wait_for(both_up, 60, "both replicas up behind HAProxy", interval=0.5,
                 detail=lambda: log.read_text(errors="replace")[-2000:])
        yield setup
    finally:
        _stop(haproxy)
        for replica in replicas:
            stop_service(replica)


def test_a_container_made_by_one_replica_decompresses_on_the_other(balanced: Balanced) -> None:
    first, second = balanced.replicas
    with balanced.client(first.base_url) as one, balanced.client(second.base_url) as other:
        container = one.compress(TEXT)
        assert other.compress(TEXT) == container  # the same bytes whichever replica made it
        assert other.decompress(container) == TEXT


def test_one_input_spread_over_both_replicas_makes_one_container_whatever_the_spread(
        balanced: Balanced, tmp_path: Path) -> None:
    first = balanced.replicas[0]
    spread, pinned = io.BytesIO(), io.BytesIO()
    with balanced.client() as through_balancer, balanced.client(first.base_url) as one_replica:
        stats = through_balancer.compress_to(spread, TEXT, concurrency=2, piece_bytes=PIECE)
        one_replica.compress_to(pinned, TEXT, concurrency=1, piece_bytes=PIECE)
        container = spread.getvalue()
        assert container == pinned.getvalue() and stats.bytes_in == len(TEXT) and stats.bytes_out == len(container)
        assert stats.segments >= len(TEXT) // PIECE  # it really was cut into pieces
        assert one_replica.decompress(container) == TEXT  # an ordinary container, whole
        restored = io.BytesIO()
        assert through_balancer.decompress_to(restored, container, concurrency=2, piece_bytes=PIECE).bytes == len(TEXT)
        assert restored.getvalue() == TEXT
    # The CLI spreads the same way and writes the same file.
    source = tmp_path / "in.py"
    source.write_bytes(TEXT)
    _cli(balanced, "compress", str(source), "--concurrency", "2", "--piece-bytes", str(PIECE))
    assert (tmp_path / "in.py.cz").read_bytes() == container
    _cli(balanced, "decompress", str(tmp_path / "in.py.cz"), "-o", str(tmp_path / "back.py"), "--concurrency", "2",
         "--piece-bytes", str(PIECE))
    assert (tmp_path / "back.py").read_bytes() == TEXT


def test_chats_sharing_a_prompt_prefix_land_on_one_replica(balanced: Balanced) -> None:
    system = "You review Python code. Answer with one short sentence about the function given."

    def replica_of(body: dict[str, object], headers: dict[str, str] | None = None) -> str:
        r = httpx.post(f"{balanced.url}/v1/chat/completions", json=body, timeout=120,
                       headers={"Authorization": f"Bearer {balanced.api_key}", **(headers or {})})
        assert r.status_code == 200, r.text
        return r.headers["x-cascade-replica"]

    same_prefix = {replica_of({"messages": [{"role": "system", "content": system},
                                            {"role": "user", "content": f"def f{i}(): return {i}"}],
                               "model": MODEL, "max_tokens": 2, "temperature": 0})
                   for i in range(5)}
    assert len(same_prefix) == 1
    # An explicit affinity key routes instead of the body; distinct keys spread over both replicas.
    keyed = {replica_of({"messages": [{"role": "user", "content": "hi"}], "model": MODEL, "max_tokens": 1},
                        {"X-Cascade-Affinity": f"session-{i}"}) for i in range(12)}
    assert keyed == {"replica1", "replica2"}


def _cli(balanced: Balanced, *args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "cascade_client", "--server", balanced.url, "--api-key",
                             balanced.api_key, "--quiet", *args], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr


def test_a_replica_killed_mid_load_loses_no_request_that_had_not_started(balanced: Balanced, tmp_path: Path) -> None:
    """Runs last: it leaves one replica dead."""
    first, second = balanced.replicas
    with balanced.client(first.base_url) as one:
        big = TEXT * 3
        container = one.compress(big)
    packed = tmp_path / "big.py.cz"
    packed.write_bytes(container)
    # A long decompression through the balancer, by the CLI: find the replica decoding it and kill that one.
    cli = subprocess.Popen([sys.executable, "-m", "cascade_client", "--server", balanced.url, "--api-key",
                            balanced.api_key, "--quiet", "decompress", str(packed), "-o", str(tmp_path / "big.py")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = wait_for(lambda: next((r for r in balanced.replicas if balanced.codec_jobs(r)), None), 120,
                      "the CLI's decompression running on a replica")
    assert victim is not None
    survivor = second if victim is first else first
    # Load through the balancer around the kill: greedy completions, k-CBS and small codec round trips.
    results: dict[str, list[object]] = {"before": [], "after": []}
    killed = threading.Event()
    body = {"model": MODEL, "prompt": "def add(a, b):\n", "max_tokens": 8, "temperature": 0}
    expected = httpx.post(f"{survivor.base_url}/v1/completions", json=body, headers=survivor.headers,
                          timeout=120).json()["choices"][0]["text"]

    def request(i: int) -> None:
        phase = "after" if killed.is_set() else "before"
        try:
            with balanced.client() as client:
                if i % 3 == 0:
                    small = TEXT[:400] + str(i).encode()
                    outcome: object = client.decompress(client.compress(small)) == small
                elif i % 3 == 1:
                    outcome = len(client.kcbs("def f(x):\n", 2, 3).sequences) == 2
                else:
                    r = httpx.post(f"{balanced.url}/v1/completions", json=body, timeout=120,
                                   headers={"Authorization": f"Bearer {balanced.api_key}"})
                    outcome = r.status_code == 200 and r.json()["choices"][0]["text"] == expected
        except CascadeError as exc:
            outcome = f"{('codec', 'kcbs', 'completion')[i % 3]}: {type(exc).__name__}: {exc}"
        results[phase].append(outcome)

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(request, i) for i in range(6)]
        _kill_replica(victim)
        killed.set()
        futures += [pool.submit(request, i) for i in range(6, 18)]
        for future in futures:
            future.result(timeout=600)
    _, stderr = cli.communicate(timeout=120)
    # The stream cut by the death: an error naming the cut, no output file (not even a short one).
    assert cli.returncode == 1 and "cut before its 'done' event" in stderr, stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.py.cz"]
    # Nothing that started after the kill was lost; before it, only a codec stream already under way
    # may have been cut (an error, never a wrong result).
    assert results["after"] and all(outcome is True for outcome in results["after"]), results["after"]
    for outcome in results["before"]:
        assert outcome is True or (isinstance(outcome, str) and outcome.startswith("codec: CascadeConnectionError")
                                   and "cut before its 'done' event" in outcome), outcome
    # The balancer has taken the dead replica out: everything now goes to the survivor.
    r = httpx.get(f"{balanced.url}/ready", headers=survivor.headers, timeout=10)
    assert r.status_code == 200 and r.headers["x-cascade-replica"] == ("replica1" if survivor is first else "replica2")
