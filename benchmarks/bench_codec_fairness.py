"""A small decompress beside a large compression, through HTTP: does the small one wait in seconds?

    python benchmarks/bench_codec_fairness.py [--model NAME] [--small 1024] [--large 204800] [--rounds 3]
        [--url http://127.0.0.1:8000]

Starts ``cascade serve`` (the embedded default model unless ``--model``; predictions off) unless
``--url`` names a running service. Held-out code (``bench_codec``'s): the small input is compressed
once, then per round its container is decompressed alone, and again while another client uploads
the large input to ``/compress`` (sent once that upload's container header has come back, so the
large prefill is running). Alone and beside alternate in each round, so both see the same machine.
Every small round trip is checked exact and every large compression must finish with a container.
The table gives medians and the ratio beside ÷ alone; issue 30's target is ≤ 5 s beside (the
default model, 1 KB beside 200 KB).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "benchmarks")]

from bench_codec import held_out_code  # noqa: E402
from http_servers import free_port, start_cascade, stop_server  # noqa: E402

RAW = {"content-type": "application/octet-stream"}


async def decompress_seconds(client: httpx.AsyncClient, container: bytes, expected: bytes) -> float:
    start = time.perf_counter()
    r = await client.post("/decompress", content=container, headers=RAW)
    seconds = time.perf_counter() - start
    r.raise_for_status()
    if r.content != expected:
        raise AssertionError("small round trip is not exact")
    return seconds


async def large_compression(client: httpx.AsyncClient, data: bytes, started: asyncio.Event) -> tuple[float, int]:
    """Upload ``data`` to ``/compress``; set ``started`` when the container's first bytes arrive."""
    start = time.perf_counter()
    size = 0
    async with client.stream("POST", "/compress", content=data, headers={"content-type": "text/plain"}) as r:
        r.raise_for_status()
        async for chunk in r.aiter_bytes():
            size += len(chunk)
            started.set()
    started.set()
    return time.perf_counter() - start, size


async def measure(url: str, small: bytes, large: bytes, rounds: int) -> list[tuple[float, float, float]]:
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(900.0)) as client:
        r = await client.post("/compress", content=small, headers={"content-type": "text/plain"})
        r.raise_for_status()
        container = r.content
        await decompress_seconds(client, container, small)  # warm-up
        results = []
        for _ in range(rounds):
            alone = await decompress_seconds(client, container, small)
            started = asyncio.Event()
            big = asyncio.create_task(large_compression(client, large, started))
            await started.wait()
            beside = await decompress_seconds(client, container, small)
            large_s, large_bytes = await big
            if large_bytes == 0:
                raise AssertionError("the large compression returned no container")
            results.append((alone, beside, large_s))
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", help="registry name (default: the embedded default model)")
    parser.add_argument("--small", type=int, default=1024)
    parser.add_argument("--large", type=int, default=204_800)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--url", help="a running service (else one is started)")
    args = parser.parse_args()
    code = held_out_code(args.small + args.large)
    small, large = code[:args.small], code[args.small:]
    server = None
    url = args.url
    if url is None:
        server = start_cascade(args.model, free_port(), Path(tempfile.mkdtemp(prefix="bench-fairness-")),
                               ["--no-enable-predictions"])
        url = server.base_url
    try:
        results = asyncio.run(measure(url, small, large, args.rounds))
    finally:
        if server is not None:
            stop_server(server)
    alone = statistics.median(r[0] for r in results)
    beside = statistics.median(r[1] for r in results)
    large_s = statistics.median(r[2] for r in results)
    print(f"model {args.model or 'default'}; {len(small)} B decompress beside a {len(large)} B compression; "
          f"{args.rounds} rounds, medians; every small round trip exact")
    print("| small alone s | small beside s | beside ÷ alone | large compress s | rounds (alone / beside) |")
    print("|---|---|---|---|---|")
    spread = ", ".join(f"{a:.2f}/{b:.2f}" for a, b, _ in results)
    print(f"| {alone:.2f} | {beside:.2f} | {beside / alone:.2f} | {large_s:.1f} | {spread} |")


if __name__ == "__main__":
    main()
