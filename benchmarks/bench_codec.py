"""Codec benchmark against a running service: bits/byte vs gzip/xz/zstd, coder overhead, throughput.

    python benchmarks/bench_codec.py --url http://127.0.0.1:8000 [--bytes 20000]

Held-out text: files the default model never trained on (its model card: the stdlib packages
json/, email/, http/, asyncio/ of CPython 3.11), read from this interpreter's standard library.
Baselines are measured in the same run on the same bytes. Throughput ratios compare against the
engine's plain prefill (compress) and plain greedy decoding (decompress) of the same tokens.
"""

from __future__ import annotations

import argparse
import gzip
import json
import lzma
import shutil
import subprocess
import sysconfig
import time
from pathlib import Path

import httpx

HELD_OUT = ("json", "email", "http", "asyncio")


def held_out_code(limit: int) -> bytes:
    root = Path(sysconfig.get_paths()["stdlib"])
    out = bytearray()
    for package in HELD_OUT:
        for path in sorted((root / package).rglob("*.py")):
            out += path.read_bytes()
            if len(out) >= limit:
                return bytes(out[:limit])
    return bytes(out)


def zstd_size(data: bytes) -> int | None:
    exe = shutil.which("zstd")
    if exe is None:
        return None
    return len(subprocess.run([exe, "-19", "--long", "-c", "-q"], input=data, capture_output=True,
                              check=True).stdout)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--api-key")
    parser.add_argument("--bytes", type=int, default=20000)
    parser.add_argument("--top-k", type=int, default=64)
    parser.add_argument("--precision", type=int, default=32)
    args = parser.parse_args()
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    data = held_out_code(args.bytes)
    client = httpx.Client(base_url=args.url, headers=headers, timeout=3600)

    start = time.perf_counter()
    r = client.post("/compress", content=data, headers={"content-type": "text/plain", "accept": "text/event-stream"},
                    params={"top_k": args.top_k, "precision_bits": args.precision})
    compress_s = time.perf_counter() - start
    events = [block for block in r.text.split("\n\n") if block.startswith("event: done")]
    stats = json.loads(events[0].split("data: ", 1)[1])
    container = client.post("/compress", content=data, headers={"content-type": "text/plain"},
                            params={"top_k": args.top_k, "precision_bits": args.precision}).content
    start = time.perf_counter()
    back = client.post("/decompress", content=container, headers={"content-type": "application/octet-stream"})
    decompress_s = time.perf_counter() - start
    exact = back.status_code == 200 and back.content == data

    tokens = stats["tokens"]
    text = data.decode("utf-8")
    model = client.get("/v1/models").json()["data"][0]["id"]
    start = time.perf_counter()
    chunk = len(text) // max(1, stats["segments"]) + 1
    for i in range(0, len(text), chunk):
        client.post("/v1/completions", json={"model": model, "prompt": text[i:i + chunk], "max_tokens": 1})
    prefill_s = time.perf_counter() - start
    per_segment = max(1, tokens // max(1, stats["segments"]))
    start = time.perf_counter()
    generated = 0
    for _ in range(stats["segments"]):
        out = client.post("/v1/completions", json={"model": model, "prompt": "</s>", "max_tokens": per_segment,
                                                    "temperature": 0, "ignore_eos": True}).json()
        generated += out["usage"]["completion_tokens"]
    greedy_s = time.perf_counter() - start

    n = len(data)
    rows = [("cascade (container)", len(container)), ("gzip -9", len(gzip.compress(data, 9))),
            ("xz -9e", len(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)))]
    z = zstd_size(data)
    if z is not None:
        rows.append(("zstd -19 --long", z))
    ideal_bits = stats["ideal_bits_per_token"] * tokens
    payload_bits = stats["bits_per_token"] * tokens
    print(f"held-out code: {n} bytes, {tokens} tokens, {stats['segments']} segments, top_k={args.top_k}, "
          f"precision={args.precision}")
    print("| method | bytes | bits/byte | × xz |")
    print("|---|---|---|---|")
    xz = rows[2][1]
    for name, size in rows:
        print(f"| {name} | {size} | {8 * size / n:.3f} | {size / xz:.2f} |")
    print(f"| model cross-entropy (ideal, same segments) | {ideal_bits / 8:.0f} | {ideal_bits / n:.3f} | "
          f"{ideal_bits / 8 / xz:.2f} |")
    print()
    print("| figure | value |")
    print("|---|---|")
    print(f"| coder overhead over the ideal (payload only) | {100 * (payload_bits / ideal_bits - 1):.3f} % |")
    print(f"| container overhead (header, records, trailer) | {len(container) - payload_bits / 8:.0f} bytes |")
    print(f"| compress tokens/s | {tokens / compress_s:.1f} |")
    print(f"| plain prefill tokens/s (same text) | {tokens / prefill_s:.1f} |")
    print(f"| compress / prefill | {prefill_s / compress_s:.3f} |")
    print(f"| decompress tokens/s | {tokens / decompress_s:.1f} |")
    print(f"| plain greedy tokens/s (same segments, sequential) | {generated / greedy_s:.1f} |")
    print(f"| decompress / greedy | {(tokens / decompress_s) / (generated / greedy_s):.3f} |")
    print(f"| round trip exact | {exact} |")


if __name__ == "__main__":
    main()
