"""Soak: mixed load at a fixed concurrency for a long time, with a steady trickle of hostile requests,
sampling gateway and engine-worker RSS so memory drift shows.

    python benchmarks/soak.py --minutes 60                      # starts its own service
    python benchmarks/soak.py --minutes 10 --sample-seconds 30  # a short run
    python benchmarks/soak.py --server http://127.0.0.1:8000 --api-key KEY --server-pid PID

The mix is ``load.py``'s (chat with and without predictions, streamed and not, codec round trips
checked byte for byte, k-CBS, top-k export) plus abandoned streams and hostile requests (lone
surrogates, oversized text, huge headers, bad parameters). Targets: every hostile request answered
4xx, no 5xx anywhere else, every codec round trip exact, and every RSS flat within 5 % after the
first 10 minutes (or the first sixth of a shorter run). Prints a table per sample and a verdict,
and draws ``benchmarks/soak.png`` (needs matplotlib; skipped with a note without it). Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import random
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load import MIX, REPO, Load, Stats, _children, loopback_only, rss_mib, server_arguments

SURROGATE = "\ud800"
ABANDON_WEIGHT = 2
HOSTILE_SHARE = 0.1


@functools.cache
def hostile_requests(model: str) -> list[tuple[str, str, bytes]]:
    """(name, path, raw JSON body): each must be refused with a 4xx, quickly. Built once: some are
    megabytes, and lone surrogates need ``json.dumps``'s ASCII escapes."""
    return [(name, path, body if isinstance(body, bytes) else json.dumps(body).encode())
            for name, path, body in _hostile_bodies(model)]


def _hostile_bodies(model: str) -> list[tuple[str, str, dict[str, Any] | bytes]]:
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    kcbs = {"model": model, "prompt": "import os\n", "beam_width": 2, "steps": 2}
    return [
        ("surrogate model", "/v1/chat/completions", {**chat, "model": SURROGATE}),
        ("surrogate prompt", "/v1/completions", {"model": model, "prompt": SURROGATE, "max_tokens": 1}),
        ("surrogate messages", "/v1/chat/completions", {**chat, "messages": [{"role": "user", "content": SURROGATE}]}),
        ("surrogate kcbs", "/v1/kcbs", {**kcbs, "prompt": SURROGATE}),
        ("surrogate tokenize", "/v1/tokenize", {"model": model, "prompt": SURROGATE}),
        ("surrogate logit_bias", "/v1/chat/completions", {**chat, "logit_bias": {SURROGATE: 1}}),
        ("surrogate stop", "/v1/chat/completions", {**chat, "stop": [SURROGATE]}),
        ("surrogate bad_words", "/v1/chat/completions", {**chat, "bad_words": [SURROGATE]}),
        ("kcbs tiny temperature", "/v1/kcbs", {**kcbs, "temperature": 5e-324}),
        ("kcbs work", "/v1/kcbs", {**kcbs, "beam_width": 32, "steps": 256}),
        ("10 MB prompt", "/v1/completions", {"model": model, "prompt": "x = 1\n" * 1_700_000, "max_tokens": 1}),
        ("2 MB kcbs target", "/v1/kcbs", {**kcbs, "target": "t" * 2_000_000}),
        ("many bad_words", "/v1/chat/completions", {**chat, "bad_words": [f"w{i}" for i in range(10_000)]}),
        ("export amplification", "/v1/completions", {"model": model, "prompt": [[5] * 1000] * 64,
                                                      "compression": True, "compression_top_k": 1024}),
        ("model echo", "/v1/chat/completions", {**chat, "model": "m" * 1_000_000}),
        ("deep json", "/v1/chat/completions", b"[" * 100_000),
        ("not json", "/v1/chat/completions", b"{not json"),
    ]


@dataclass
class Hostile:
    sent: int = 0
    not_4xx: list[str] = field(default_factory=list)


async def send_hostile(client: httpx.AsyncClient, rng: random.Random, model: str, record: Hostile) -> None:
    name, path, content = rng.choice(hostile_requests(model))
    record.sent += 1
    try:
        r = await client.post(path, content=content, headers={"content-type": "application/json"})
        status = r.status_code
    except httpx.HTTPError as exc:
        record.not_4xx.append(f"{name}: {type(exc).__name__}")
        return
    if not 400 <= status < 500:
        record.not_4xx.append(f"{name}: {status}")


def huge_header(url: str, key: str | None, record: Hostile) -> None:
    """A 1 MB header on a raw socket: must be 431 (uvicorn buffers headers before any app code)."""
    parsed = urlparse(url)
    record.sent += 1
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 80), timeout=30) as sock:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(f"GET /v1/models HTTP/1.1\r\nHost: x\r\n{auth}X-Big: ".encode() + b"a" * (1 << 20)
                             + b"\r\n\r\n")
            reply = sock.recv(4096)
        status = int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/") else 0
    except OSError as exc:
        record.not_4xx.append(f"huge header: {type(exc).__name__}")
        return
    if not 400 <= status < 500:
        record.not_4xx.append(f"huge header: {status}")


async def abandon_stream(client: httpx.AsyncClient, rng: random.Random, model: str, stats: Stats) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "write a function"}], "max_tokens": 400,
            "ignore_eos": True, "stream": True, "seed": rng.randrange(1 << 30)}
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            stats.fail("abandoned stream", r.status_code, r.text)
            return
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                break
    stats.ok("abandoned stream", 0.0)


def memory_sample(pid: int) -> dict[str, float]:
    """RSS in MiB: the gateway, and each vLLM process under it (per engine an ``EngineCore`` and its
    ``Worker``; numbered in pid order, i.e. start order)."""
    sample = {"gateway": rss_mib(pid)}
    counts: dict[str, int] = {}
    for child in sorted(_children(pid)):
        try:
            name = Path(f"/proc/{child}/comm").read_text().strip()
        except OSError:
            continue
        if name.startswith("VLLM::"):
            kind = "worker" if "Worker" in name else "engine core"
            counts[kind] = counts.get(kind, 0) + 1
            sample[f"{kind} {counts[kind]}"] = rss_mib(child)
    return sample


async def soak(url: str, key: str | None, pid: int | None, args: argparse.Namespace) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    stats, hostile = Stats(), Hostile()
    ops, weights = zip(*[*MIX, ("abandon", ABANDON_WEIGHT)], strict=True)
    deadline = time.monotonic() + args.minutes * 60
    samples: list[tuple[float, dict[str, float], int]] = []
    limits = httpx.Limits(max_connections=args.clients + 8, max_keepalive_connections=args.clients + 8)
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600, limits=limits) as client:

        async def worker(index: int) -> None:
            rng = random.Random(args.seed * 1000 + index)
            load = Load(client, stats, rng, args.model)
            while time.monotonic() < deadline:
                try:
                    if rng.random() < HOSTILE_SHARE:
                        if rng.random() < 0.05:
                            await asyncio.to_thread(huge_header, url, key, hostile)
                        else:
                            await send_hostile(client, rng, args.model, hostile)
                        continue
                    op = rng.choices(ops, weights)[0]
                    if op == "abandon":
                        await abandon_stream(client, rng, args.model, stats)
                    else:
                        await load.run(op)
                except httpx.HTTPError as exc:
                    stats.fail("transport", None, f"{type(exc).__name__}: {exc}")

        async def sampler() -> None:
            while time.monotonic() < deadline:
                if pid is not None:
                    total = sum(len(v) for v in stats.latencies.values())
                    samples.append((time.monotonic() - started, memory_sample(pid), total))
                    print(row(samples[-1], stats, hostile), flush=True)
                await asyncio.sleep(min(args.sample_seconds, max(0.0, deadline - time.monotonic())))

        print(header_row(pid), flush=True)
        await asyncio.gather(sampler(), *(worker(i) for i in range(args.clients)))
        if pid is not None:
            samples.append((time.monotonic() - started, memory_sample(pid),
                            sum(len(v) for v in stats.latencies.values())))
            print(row(samples[-1], stats, hostile), flush=True)
    return verdict(samples, stats, hostile, args)


def header_row(pid: int | None) -> str:
    names = list(memory_sample(pid)) if pid is not None else []
    return ("| minute | " + " | ".join(f"{n} RSS MiB" for n in names) + " | requests ok | 5xx/transport | "
            "hostile sent | hostile not 4xx |\n|---:|" + "---:|" * (len(names) + 4))


def row(sample: tuple[float, dict[str, float], int], stats: Stats, hostile: Hostile) -> str:
    at, memory, ok = sample
    return (f"| {at / 60:.1f} | " + " | ".join(f"{v:.0f}" for v in memory.values())
            + f" | {ok} | {sum(stats.other_errors.values())} | {hostile.sent} | {len(hostile.not_4xx)} |")


def drift(samples: list[tuple[float, dict[str, float], int]], warmup: float) -> dict[str, float]:
    """Per process: (max − min) / min of RSS over the samples after ``warmup`` seconds, in %."""
    after = [memory for at, memory, _ in samples if at >= warmup]
    out = {}
    for name in after[0] if after else {}:
        values = [m[name] for m in after if name in m]
        out[name] = 100.0 * (max(values) - min(values)) / min(values) if values and min(values) else float("nan")
    return out


def verdict(samples: list[tuple[float, dict[str, float], int]], stats: Stats, hostile: Hostile,
            args: argparse.Namespace) -> int:
    warmup = min(600.0, args.minutes * 60 / 6)
    flat = drift(samples, warmup)
    exact = f"{stats.exact}/{stats.round_trips}"
    print(f"\nrun: {args.minutes:g} min, {args.clients} clients; requests ok: "
          f"{sum(len(v) for v in stats.latencies.values())}; 4xx (non-hostile): {sum(stats.client_errors.values())}")
    print(f"5xx or transport errors (non-hostile): {sum(stats.other_errors.values())}")
    for sample in stats.error_samples:
        print(f"  error sample: {sample}")
    print(f"hostile requests: {hostile.sent}, answered other than 4xx: {len(hostile.not_4xx)} "
          f"{hostile.not_4xx[:5]}")
    print(f"codec round trips exact: {exact}")
    print(f"RSS drift after the first {warmup / 60:.1f} min: " + ", ".join(f"{k} {v:.1f} %" for k, v in flat.items()))
    if samples and not args.no_plot:
        plot(samples, Path(args.plot))
    failed = (stats.other_errors or hostile.not_4xx or stats.exact != stats.round_trips
              or any(v > 5.0 for v in flat.values()))
    return 1 if failed else 0


def plot(samples: list[tuple[float, dict[str, float], int]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("soak.png: skipped (pip install matplotlib to draw it)")
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name in samples[-1][1]:
        ax.plot([at / 60 for at, _, _ in samples], [m.get(name, float("nan")) for _, m, _ in samples],
                marker="o", label=name)
    ax.set_xlabel("minutes")
    ax.set_ylabel("RSS (MiB)")
    ax.set_title("Cascade soak: RSS per process")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"plot: {path}")


def main() -> int:
    parser = server_arguments(__doc__)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--sample-seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--plot", default=str(Path(__file__).resolve().parent / "soak.png"))
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--serve-args", default="", help="extra `cascade serve` flags when starting a service")
    args = parser.parse_args()
    if args.server:
        loopback_only(args.server)
        return asyncio.run(soak(args.server.rstrip("/"), args.api_key, args.server_pid, args))
    sys.path.insert(0, str(REPO))
    from tests.integration.conftest import start_service, stop_service

    service = start_service(Path(tempfile.mkdtemp(prefix="cascade-soak-")), args.serve_args.split(), timeout=900)
    try:
        return asyncio.run(soak(service.base_url, service.api_key, service.process.pid, args))
    finally:
        print(f"service exit code after SIGTERM: {stop_service(service)}; its log: {service.log_path}")


if __name__ == "__main__":
    sys.exit(main())
