"""Codec throughput with one and with two replicas: one input spread over them through HAProxy.

    # two replicas (any two running gateways of the same model), then:
    python -m cascade serve --port 8001 --no-enable-predictions &
    python -m cascade serve --port 8002 --no-enable-predictions &
    python benchmarks/bench_replicas.py --replica 127.0.0.1:8001 --replica 127.0.0.1:8002 [--bytes 32768]
        [--piece-bytes 8192] [--concurrency 2] [--api-key KEY]

The script starts HAProxy (``deploy/haproxy/haproxy.cfg``, Debian's ``haproxy``) in front of the two
replicas and times, on the same held-out code (as ``bench_codec.py``), compress and decompress:

- ``one stream``: the whole input as one request to replica 1 (the baseline, ratio 1.00);
- ``spread, 1 replica``: the input in pieces, ``--concurrency`` at once, all to replica 1;
- ``spread, 2 replicas``: the same pieces through HAProxy, spread over both replicas.

Spread runs must give the same container whichever replicas served the pieces (checked), and
every container must decompress to the input (checked). Throughput is input bytes per second.
What it can show depends on the machine: two replicas on one 2-core host share those cores, so
there the figure measures the mechanism's overhead (pieces, splicing, the balancer) rather than
scaling; on separate nodes or GPUs each replica brings its own compute.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from bench_codec import held_out_code
from cascade_client import CascadeClient

CONFIG = Path(__file__).resolve().parents[1] / "deploy" / "haproxy" / "haproxy.cfg"


def start_haproxy(replicas: list[str], api_key: str) -> tuple[subprocess.Popen[bytes], str]:
    exe = shutil.which("haproxy")
    if exe is None:
        sys.exit("haproxy is not installed (apt-get install haproxy)")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "CASCADE_LB_PORT": str(port), "CASCADE_API_KEY": api_key,
           "CASCADE_REPLICA_1": replicas[0], "CASCADE_REPLICA_2": replicas[1]}
    process = subprocess.Popen([exe, "-db", "-f", str(CONFIG)], env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    seen: set[str] = set()
    deadline = time.monotonic() + 60
    while seen != {"replica1", "replica2"}:
        if time.monotonic() > deadline:
            stop(process)
            sys.exit(f"HAProxy did not reach both replicas (saw {sorted(seen)})")
        try:
            r = httpx.get(f"{url}/ready", headers={"Authorization": f"Bearer {api_key}"}, timeout=5)
            if r.status_code == 200:
                seen.add(r.headers.get("x-cascade-replica", ""))
        except httpx.HTTPError:
            time.sleep(0.5)
    return process, url


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def timed(run: Callable[[], bytes]) -> tuple[bytes, float]:
    started = time.perf_counter()
    out = run()
    return out, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replica", action="append", required=True, help="host:port of a replica (twice)")
    parser.add_argument("--api-key", default=os.environ.get("CASCADE_API_KEY", ""))
    parser.add_argument("--bytes", type=int, default=32768)
    parser.add_argument("--piece-bytes", type=int, default=8192)
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args()
    if len(args.replica) != 2:
        sys.exit("give --replica twice")
    text = held_out_code(args.bytes)
    haproxy, balancer = start_haproxy(args.replica, args.api_key)
    spread = {"concurrency": args.concurrency, "piece_bytes": args.piece_bytes}
    rows: list[tuple[str, float, float]] = []
    try:
        key = args.api_key or None
        with CascadeClient(f"http://{args.replica[0]}", key) as one, CascadeClient(balancer, key) as both:
            def compress(client: CascadeClient, **options: int) -> bytes:
                out = io.BytesIO()
                client.compress_to(out, text, **options)
                return out.getvalue()

            def decompress(client: CascadeClient, container: bytes, **options: int) -> bytes:
                out = io.BytesIO()
                client.decompress_to(out, container, **options)
                return out.getvalue()

            whole, c_whole = timed(lambda: compress(one))
            back, d_whole = timed(lambda: decompress(one, whole))
            assert back == text, "one-stream round trip"
            rows.append(("one stream, replica 1", c_whole, d_whole))
            pieces_one, c_one = timed(lambda: compress(one, **spread))
            back, d_one = timed(lambda: decompress(one, pieces_one, **spread))
            assert back == text, "spread round trip on one replica"
            rows.append((f"spread ×{args.concurrency}, 1 replica", c_one, d_one))
            pieces_two, c_two = timed(lambda: compress(both, **spread))
            back, d_two = timed(lambda: decompress(both, pieces_two, **spread))
            assert back == text and pieces_two == pieces_one, "spread over two replicas: same container, exact"
            rows.append((f"spread ×{args.concurrency}, 2 replicas (HAProxy)", c_two, d_two))
    finally:
        stop(haproxy)
    print(f"{len(text)} bytes of held-out code, pieces of {args.piece_bytes} bytes; container "
          f"{len(whole)} bytes one stream, {len(pieces_one)} spread (identical over 1 and 2 replicas)")
    print("| run | compress KB/s | × | decompress KB/s | × |\n|---|---|---|---|---|")
    for name, c, d in rows:
        print(f"| {name} | {len(text) / c / 1024:.1f} | {c_whole / c:.2f} | {len(text) / d / 1024:.2f} | "
              f"{d_whole / d:.2f} |")


if __name__ == "__main__":
    main()
