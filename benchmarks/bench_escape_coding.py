"""What a token outside the top-k costs: container version 3 (uniform rank) against version 4 (the exact
model's own weights), as payload bytes against the exact model's cross-entropy measured in the same run.

    python benchmarks/bench_escape_coding.py [--kinds code,prose] [--bytes 131072] [--lane-tokens 256]
        [--top-k 16,64,1024] [--model-dir DIR]

The held-out texts of ``bench_codec.py``, cut into lanes of ``--lane-tokens`` tokens (each conditioned
on the separator only), coded in-process by the exact runner at each top-k both ways; one lane group
is decoded back under each version to check the round trip.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "service"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_codec import MODEL_DIR, held_out_code, held_out_prose


async def run(args: argparse.Namespace) -> None:
    from cascade.codec.exact.model import ExactLlama
    from cascade.codec.exact.runner import ExactRunner
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(args.model_dir))
    separator = int(tokenizer.eos_token_id)
    model = ExactLlama.from_pretrained(args.model_dir, args.lane_tokens + 1)
    runner = ExactRunner(model, model.config.vocab_size, max_rows=32)
    print(f"model={args.model_dir.name} bytes={args.bytes} lane_tokens={args.lane_tokens}")
    print("| text | top-k | tokens | exact CE bytes | version 3 bytes | × CE | version 4 bytes | × CE | "
          "version 4 / version 3 | round trips | seconds |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    try:
        for kind in args.kinds.split(","):
            data = (held_out_code if kind == "code" else held_out_prose)(args.bytes)
            ids = tokenizer.encode(data.decode("utf-8"), add_special_tokens=False)
            lanes = [ids[i:i + args.lane_tokens] for i in range(0, len(ids), args.lane_tokens)]
            for top_k in (int(k) for k in args.top_k.split(",")):
                start = time.perf_counter()
                coded = {w: await runner.encode([separator], lanes, top_k, 32, weighted_escapes=w)
                         for w in (False, True)}
                few = lanes[:8]
                exact = True
                for w in (False, True):
                    small = await runner.encode([separator], few, top_k, 32, weighted_escapes=w)
                    back = await runner.decode([separator], [len(x) for x in few], small.payload, top_k, 32,
                                               weighted_escapes=w)
                    exact = exact and back == few
                ideal = coded[True].ideal_bits / 8
                v3, v4 = len(coded[False].payload), len(coded[True].payload)
                print(f"| {kind} | {top_k} | {len(ids)} | {ideal:.0f} | {v3} | {v3 / ideal:.4f} | {v4} | "
                      f"{v4 / ideal:.4f} | {v4 / v3:.4f} | {exact} | {time.perf_counter() - start:.0f} |")
    finally:
        runner.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kinds", default="code,prose")
    parser.add_argument("--bytes", type=int, default=131072)
    parser.add_argument("--lane-tokens", type=int, default=256)
    parser.add_argument("--top-k", default="16,64,1024")
    parser.add_argument("--model-dir", type=Path, default=MODEL_DIR)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
