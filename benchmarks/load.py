"""Mixed-load soak of one Cascade service: chat (with/without prediction, streaming or not),
/compress + /decompress (every round trip checked byte-exact), /v1/kcbs and, where the server has
it, top-k export — at several concurrency levels, bounded in time and in request count.

    python benchmarks/load.py                                  # starts its own service (all engines)
    python benchmarks/load.py --server http://127.0.0.1:8000 --api-key KEY --server-pid PID
    python benchmarks/load.py --concurrency 8 32 64 --duration 90 --max-requests 20000

Loopback only: it refuses any server that is not on 127.0.0.0/8 or ::1. When it starts its own
service, run it under the engine lock (``flock /tmp/cascade-engines.lock python benchmarks/load.py``).
Prints one markdown table per level (throughput per endpoint, p50/p95/p99 latency, errors split into
4xx and other) and a summary table: codec round trips exact, gateway and engine RSS (the gateway's
child processes, read from /proc) at start and end, and requests left unfinished in the engines.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import ipaddress
import json
import os
import random
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

REPO = Path(__file__).resolve().parents[1]
MODEL = "pycoder-23m"
SNIPPETS = [
    'def greet(name):\n    """Say hello."""\n    return f"hello {name}"\n',
    "import os\n\nfor root, dirs, files in os.walk('.'):\n    print(root, len(files))\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "x = [i * i for i in range(10)]\nprint(sum(x))\n",
    "NAME\n     ls - list directory contents\nSYNOPSIS\n     ls [OPTION]... [FILE]...\n",
]
PREDICTION = "def handler(event, context):\n    body = event.get('body')\n    return {'status': 200, 'body': body}\n"
# (operation, weight): chat dominates, as in real traffic; codec ops are slow (one sequence at a time).
MIX = [("chat", 5), ("chat_stream", 4), ("chat_prediction", 3), ("chat_prediction_stream", 2), ("codec", 2),
       ("kcbs", 2), ("topk_export", 2)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))] if ordered else float("nan")


def loopback_only(url: str) -> None:
    host = urlparse(url).hostname or ""
    try:
        ok = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = False
    if not ok:
        sys.exit(f"load.py: refusing non-loopback server {url!r} (this is a local soak test)")


# ------------------------------------------------------------------------------------------ /proc


def _children(pid: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == parent]
        found += kids
        frontier += kids
    return found


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def breakdown(pid: int | None) -> dict[str, float]:
    """RSS of each descendant (``pid name``), to see which engine process grows."""
    out = {}
    for child in _children(pid) if pid is not None else []:
        try:
            name = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")[-40:]
        except OSError:
            continue
        out[f"{child} {name}"] = rss_mib(child)
    return out


def memory(pid: int | None) -> tuple[float, float]:
    """(gateway RSS, sum of its descendants' RSS — the engine processes), MiB."""
    if pid is None:
        return float("nan"), float("nan")
    return rss_mib(pid), sum(rss_mib(child) for child in _children(pid))


# ------------------------------------------------------------------------------------------ stats


@dataclass
class Stats:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    client_errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    other_errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    error_samples: list[str] = field(default_factory=list)
    round_trips: int = 0
    exact: int = 0
    missing_retry_after: int = 0

    def ok(self, endpoint: str, seconds: float) -> None:
        self.latencies[endpoint].append(seconds)

    def fail(self, endpoint: str, status: int | None, detail: str) -> None:
        if status is not None and 400 <= status < 500:
            self.client_errors[endpoint] += 1
        else:
            self.other_errors[endpoint] += 1
        if len(self.error_samples) < 8:
            self.error_samples.append(f"{endpoint}: {status} {detail[:160]}")


def _check_status(r: httpx.Response, stats: Stats) -> bool:
    if r.status_code in (429, 503) and not r.headers.get("retry-after"):
        stats.missing_retry_after += 1
    return r.status_code == 200


def _stream_error(line: str) -> tuple[int, str] | None:
    if line.startswith('data: {"error"'):
        error = json.loads(line[6:])["error"]
        status = 400 if error.get("type") in ("invalid_request_error", "not_found_error") else 500
        return status, str(error.get("message"))
    return None


# ------------------------------------------------------------------------------------- operations


class Load:
    def __init__(self, client: httpx.AsyncClient, stats: Stats, rng: random.Random, model: str) -> None:
        self.client, self.stats, self.rng, self.model = client, stats, rng, model

    def _chat_body(self, prediction: bool, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "max_tokens": self.rng.choice((16, 32, 48)),
                                "temperature": self.rng.choice((0.0, 0.8)), "seed": self.rng.randrange(1 << 30),
                                "messages": [{"role": "user", "content": self.rng.choice(SNIPPETS)}]}
        if prediction:
            body["prediction"] = {"type": "content", "content": PREDICTION}
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    async def chat(self, endpoint: str, prediction: bool, stream: bool) -> None:
        body = self._chat_body(prediction, stream)
        started = time.perf_counter()
        if not stream:
            r = await self.client.post("/v1/chat/completions", json=body)
            if _check_status(r, self.stats) and r.json()["usage"]["completion_tokens"] > 0:
                self.stats.ok(endpoint, time.perf_counter() - started)
            else:
                self.stats.fail(endpoint, r.status_code, r.text)
            return
        async with self.client.stream("POST", "/v1/chat/completions", json=body) as r:
            if not _check_status(r, self.stats):
                await r.aread()
                self.stats.fail(endpoint, r.status_code, r.text)
                return
            done = False
            async for line in r.aiter_lines():
                failed = _stream_error(line)
                if failed:
                    self.stats.fail(endpoint, *failed)
                    return
                done = done or line == "data: [DONE]"
        if done:
            self.stats.ok(endpoint, time.perf_counter() - started)
        else:
            self.stats.fail(endpoint, None, "stream ended without [DONE]")

    async def codec(self) -> None:
        data = self.rng.choice(SNIPPETS).encode()
        if self.rng.random() < 0.2:
            data += bytes(self.rng.randrange(256) for _ in range(12))  # not UTF-8: a raw segment
        sse = self.rng.random() < 0.5
        started = time.perf_counter()
        if sse:
            r = await self.client.post("/compress", content=data, headers={"content-type": "text/plain",
                                                                           "accept": "text/event-stream"})
            chunks = [json.loads(block.split("data: ", 1)[1]) for block in r.text.split("\n\n")
                      if block.startswith("event: chunk")]
            container = b"".join(base64.b64decode(c["data"]) for c in chunks)
            good = r.status_code == 200 and "event: done" in r.text
        else:
            r = await self.client.post("/compress", content=data, headers={"content-type": "text/plain"})
            container, good = r.content, r.status_code == 200
        _check_status(r, self.stats)
        if not good:
            self.stats.fail("/compress", r.status_code, r.text)
            return
        self.stats.ok("/compress", time.perf_counter() - started)
        started = time.perf_counter()
        if sse:
            d = await self.client.post("/decompress", json={"data": base64.b64encode(container).decode()},
                                       headers={"accept": "text/event-stream"})
            events = [(block.split("\n", 1)[0], json.loads(block.split("data: ", 1)[1]))
                      for block in d.text.split("\n\n") if block.startswith("event: ")]
            back = b"".join(e["text"].encode() if "text" in e else base64.b64decode(e["data_b64"])
                            for name, e in events if name == "event: text")
            good = d.status_code == 200 and any(name == "event: done" for name, _ in events)
        else:
            d = await self.client.post("/decompress", content=container,
                                       headers={"content-type": "application/octet-stream"})
            back, good = d.content, d.status_code == 200
        _check_status(d, self.stats)
        if not good:
            self.stats.fail("/decompress", d.status_code, d.text)
            return
        self.stats.ok("/decompress", time.perf_counter() - started)
        self.stats.round_trips += 1
        self.stats.exact += back == data
        if back != data:
            self.stats.fail("/decompress", None, f"round trip differs ({len(back)} vs {len(data)} bytes)")

    async def kcbs(self) -> None:
        body = {"model": self.model, "prompt": self.rng.choice(SNIPPETS)[:40], "beam_width": self.rng.choice((2, 4)),
                "steps": self.rng.choice((4, 8)), "stream": self.rng.random() < 0.3}
        started = time.perf_counter()
        r = await self.client.post("/v1/kcbs", json=body)
        failed = next((f for f in map(_stream_error, r.text.splitlines()) if f), None) if body["stream"] else None
        if _check_status(r, self.stats) and failed is None:
            self.stats.ok("/v1/kcbs", time.perf_counter() - started)
        else:
            self.stats.fail("/v1/kcbs", failed[0] if failed else r.status_code, r.text)

    async def topk_export(self) -> None:
        started = time.perf_counter()
        r = await self.client.post("/v1/completions", json=topk_body(self.model, self.rng.choice(SNIPPETS)))
        if _check_status(r, self.stats):
            self.stats.ok("topk export", time.perf_counter() - started)
        else:
            self.stats.fail("topk export", r.status_code, r.text)

    async def run(self, op: str) -> None:
        try:
            if op.startswith("chat"):
                await self.chat(f"chat{' +pred' if 'prediction' in op else ''}{' stream' if 'stream' in op else ''}",
                                "prediction" in op, "stream" in op)
            elif op == "codec":
                await self.codec()
            elif op == "kcbs":
                await self.kcbs()
            else:
                await self.topk_export()
        except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
            self.stats.fail(op, None, f"{type(exc).__name__}: {exc}")


def topk_body(model: str, text: str) -> dict[str, Any]:
    return {"model": model, "prompt": text, "compression": True, "compression_top_k": 20, "max_tokens": 0}


async def unfinished(client: httpx.AsyncClient) -> float:
    text = (await client.get("/metrics")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("cascade_engine_unfinished_requests{"))


async def live_state_total(client: httpx.AsyncClient) -> int | None:
    r = await client.get("/ops/live-state")
    if r.status_code != 200:
        return None
    state = r.json()
    return sum(v for e in state["engines"].values() for v in e.values()) + state["gateway"]["kcbs_searches"]


async def run_level(url: str, headers: dict[str, str], model: str, concurrency: int, duration: float,
                    max_requests: int, mix: list[tuple[str, int]], seed: int) -> tuple[Stats, float]:
    stats = Stats()
    ops, weights = zip(*mix, strict=True)
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300, limits=limits) as client:
        deadline = time.monotonic() + duration
        issued = 0

        async def worker(index: int) -> None:
            nonlocal issued
            load = Load(client, stats, random.Random(seed * 1000 + index), model)
            while time.monotonic() < deadline and issued < max_requests:
                issued += 1
                await load.run(load.rng.choices(ops, weights)[0])

        started = time.monotonic()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        return stats, time.monotonic() - started


def level_table(concurrency: int, stats: Stats, wall: float) -> str:
    rows = [f"**{concurrency} concurrent clients** ({wall:.0f} s)", "",
            "| endpoint | ok | req/s | p50 s | p95 s | p99 s | 4xx | other errors |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    endpoints = sorted(set(stats.latencies) | set(stats.client_errors) | set(stats.other_errors))
    for name in endpoints:
        lat = stats.latencies.get(name, [])
        rows.append(f"| {name} | {len(lat)} | {len(lat) / wall:.2f} | {percentile(lat, 0.5):.2f} | "
                    f"{percentile(lat, 0.95):.2f} | {percentile(lat, 0.99):.2f} | {stats.client_errors.get(name, 0)} | "
                    f"{stats.other_errors.get(name, 0)} |")
    total = sum(len(v) for v in stats.latencies.values())
    rows.append(f"| **all** | {total} | {total / wall:.2f} | | | | {sum(stats.client_errors.values())} | "
                f"{sum(stats.other_errors.values())} |")
    return "\n".join(rows)


async def main_async(args: argparse.Namespace, url: str, key: str | None, pid: int | None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    mix = [(op, w) for op, w in MIX if not args.only or op in args.only.split(",")]
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
        probe = await client.post("/v1/completions", json=topk_body(args.model, SNIPPETS[0]))
        if not any(op == "topk_export" for op, _ in mix):
            pass
        elif probe.status_code != 200:
            mix = [(op, w) for op, w in mix if op != "topk_export"]
            print(f"top-k export: skipped (server answers {probe.status_code}: {probe.text[:120]})")
        else:
            print("top-k export: in the mix")
    start_mem = memory(pid)
    start_parts = breakdown(pid)
    summary = []
    exit_code = 0
    for concurrency in args.concurrency:
        before = memory(pid)
        stats, wall = await run_level(url, headers, args.model, concurrency, args.duration, args.max_requests, mix,
                                      args.seed)
        after = memory(pid)
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
            await asyncio.sleep(2)
            left = await unfinished(client)
            live = await live_state_total(client)
        print(level_table(concurrency, stats, wall))
        for sample in stats.error_samples:
            print(f"  error sample: {sample}")
        exact = 100.0 * stats.exact / stats.round_trips if stats.round_trips else float("nan")
        summary.append(f"| {concurrency} | {stats.round_trips} | {exact:.1f} % | {before[0]:.0f} → {after[0]:.0f} | "
                       f"{before[1]:.0f} → {after[1]:.0f} | {left:.0f} | {live if live is not None else 'n/a'} | "
                       f"{stats.missing_retry_after} |")
        print()
        if sum(stats.other_errors.values()) or stats.exact != stats.round_trips or left or stats.missing_retry_after:
            exit_code = 1
    end_mem = memory(pid)
    print("| clients | codec round trips | exact | gateway RSS MiB (level start → end) | engines RSS MiB | "
          "unfinished engine requests after | live per-request state after | 429/503 without Retry-After |")
    print("|---:|---:|---:|---|---|---:|---:|---:|")
    print("\n".join(summary))
    print(f"\nwhole run: gateway RSS {start_mem[0]:.0f} → {end_mem[0]:.0f} MiB, engines RSS "
          f"{start_mem[1]:.0f} → {end_mem[1]:.0f} MiB")
    for name, end in breakdown(pid).items():
        print(f"  {name}: {start_parts.get(name, float('nan')):.0f} → {end:.0f} MiB")
    return exit_code


def server_arguments(doc: str | None) -> argparse.ArgumentParser:
    """A parser with the flags every soak/load script takes: which service, its key and pid, the model."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", help="a running service (loopback only); default: start one")
    parser.add_argument("--api-key", default=os.environ.get("CASCADE_API_KEY"))
    parser.add_argument("--server-pid", type=int, help="the service's pid, for RSS (with --server)")
    parser.add_argument("--model", default=MODEL)
    return parser


def main() -> int:
    parser = server_arguments(__doc__)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--duration", type=float, default=90.0, help="seconds per level (bound 1)")
    parser.add_argument("--max-requests", type=int, default=20000, help="requests per level (bound 2)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--serve-args", default="", help="extra `cascade serve` flags when starting a service")
    parser.add_argument("--only", help="comma-separated operations to keep from the mix "
                        f"({', '.join(op for op, _ in MIX)})")
    args = parser.parse_args()
    if args.server:
        loopback_only(args.server)
        return asyncio.run(main_async(args, args.server.rstrip("/"), args.api_key, args.server_pid))
    sys.path.insert(0, str(REPO))
    from tests.integration.conftest import start_service, stop_service

    tmp = tempfile.mkdtemp(prefix="cascade-load-")
    service = start_service(Path(tmp), args.serve_args.split())
    try:
        code = asyncio.run(main_async(args, service.base_url, service.api_key, service.process.pid))
    finally:
        alive = service.process.poll() is None
        stopped = stop_service(service)
        print(f"service {'exit code after SIGTERM' if alive else 'had already exited with'}: {stopped}; "
              f"its log: {service.log_path}")
    return code


if __name__ == "__main__":
    sys.exit(main())
