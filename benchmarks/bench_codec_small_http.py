"""Small files through HTTP, as a user sends them: seconds to compress and to decompress, and their ratio.

    python benchmarks/bench_codec_small_http.py --url http://127.0.0.1:8014 [--rounds 2]
        [--sizes 1024,4096] [--kinds code,prose]

Against a running service (e.g. ``cascade serve --model smollm2-135m-instruct --no-enable-predictions
--port 8014``): held-out code and prose (``bench_codec``'s) of each size, posted raw to ``/compress``,
the container posted raw to ``/decompress``, every round trip checked byte for byte; medians of
``--rounds``. The issue's own measurements were made this way (issue 30: SmolLM2 1 KB 0.5 s / 5.9 s,
4 KB 2.8 s / 23.0 s). The ratio column is decompress ÷ compress of the same run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path[:0] = [str(Path(__file__).resolve().parent)]
from bench_codec import held_out_code, held_out_prose  # noqa: E402

OCTET = {"content-type": "application/octet-stream"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sizes", default="1024,4096")
    parser.add_argument("--kinds", default="code,prose")
    args = parser.parse_args()
    print(f"{args.url}, medians of {args.rounds} rounds, raw bodies, every round trip exact")
    print("| text | bytes | container bytes | compress s | decompress s | decompress ÷ compress |")
    print("|---|---|---|---|---|---|")
    with httpx.Client(base_url=args.url, timeout=900) as client:
        for kind in args.kinds.split(","):
            for size in (int(s) for s in args.sizes.split(",")):
                source = (held_out_code if kind == "code" else held_out_prose)(size)
                compress, decompress, container = [], [], b""
                for _ in range(args.rounds):
                    start = time.perf_counter()
                    reply = client.post("/compress", content=source, headers=OCTET)
                    compress.append(time.perf_counter() - start)
                    reply.raise_for_status()
                    container = reply.content
                    start = time.perf_counter()
                    back = client.post("/decompress", content=container, headers=OCTET)
                    decompress.append(time.perf_counter() - start)
                    back.raise_for_status()
                    assert back.content == source, f"{kind} {size}: the round trip is not exact"
                c, d = statistics.median(compress), statistics.median(decompress)
                print(f"| {kind} | {len(source)} | {len(container)} | {c:.2f} | {d:.2f} | {d / c:.1f} |", flush=True)


if __name__ == "__main__":
    main()
