"""Chat throughput and latency against a running Cascade service, at several concurrency levels.

    python benchmarks/bench_chat.py --url http://127.0.0.1:8000 [--api-key KEY] [--requests 32]

Prints a markdown table: completion tokens/s, TTFT p50/p95 and request latency p50/p95 per
concurrency level, and each level's throughput as a ratio of the 1-client baseline of the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


async def one_request(client: httpx.AsyncClient, model: str, max_tokens: int, i: int) -> tuple[float, float, int]:
    body = {"model": model, "messages": [{"role": "user", "content": f"write function number {i}"}],
            "max_tokens": max_tokens, "temperature": 0.8, "seed": i, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    ttft = None
    tokens = 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            if ttft is None:
                ttft = time.perf_counter() - start
            if '"usage":{' in line:
                import json

                tokens = json.loads(line[6:])["usage"]["completion_tokens"]
    return ttft or 0.0, time.perf_counter() - start, tokens


async def level(url: str, key: str | None, model: str, concurrency: int, requests: int,
                max_tokens: int) -> dict[str, float]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600, limits=limits) as client:
        sem = asyncio.Semaphore(concurrency)

        async def guarded(i: int) -> tuple[float, float, int]:
            async with sem:
                return await one_request(client, model, max_tokens, i)

        start = time.perf_counter()
        results = await asyncio.gather(*(guarded(i) for i in range(requests)))
        wall = time.perf_counter() - start
    ttfts = [r[0] for r in results]
    lat = [r[1] for r in results]
    tokens = sum(r[2] for r in results)
    return {"concurrency": concurrency, "tok_s": tokens / wall, "ttft_p50": statistics.median(ttfts),
            "ttft_p95": percentile(ttfts, 0.95), "lat_p50": statistics.median(lat), "lat_p95": percentile(lat, 0.95)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--api-key")
    parser.add_argument("--model", default="pycoder-23m")
    parser.add_argument("--levels", default="1,8,32")
    parser.add_argument("--requests", type=int, default=32, help="requests per level (≥ concurrency)")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    rows = []
    for c in (int(x) for x in args.levels.split(",")):
        rows.append(asyncio.run(level(args.url, args.api_key, args.model, c, max(c, args.requests), args.max_tokens)))
    base = rows[0]["tok_s"]
    print("| clients | tokens/s | × 1-client | TTFT p50 (s) | TTFT p95 (s) | latency p50 (s) | latency p95 (s) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['concurrency']} | {r['tok_s']:.1f} | {r['tok_s'] / base:.2f} | {r['ttft_p50']:.3f} | "
              f"{r['ttft_p95']:.3f} | {r['lat_p50']:.3f} | {r['lat_p95']:.3f} |")


if __name__ == "__main__":
    main()
