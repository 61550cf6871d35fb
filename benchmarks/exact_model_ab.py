"""Interleaved A/B speed of the exact model: this checkout against another release's ``service/``.

Usage: ``python benchmarks/exact_model_ab.py BASELINE_SERVICE_DIR [--rows 32] [--context 256]
[--threads 2] [--kernels fast] [--rounds 20] [--steps 8] [--model-dir models/pycoder-23m]
[--prefill 8]``. Two worker processes (one per tree) load the model, prefill ``rows`` sequences of
``context`` tokens and then, round by round and in alternating order, each run ``steps`` decode steps
of all rows (``logits(step(...))``) and one prefill + logits of ``--prefill`` × ``context`` tokens (0:
none). Both see the same machine load within a round, so the ratio of their medians is meaningful on a
shared, loaded machine where single runs are not. Prints a table of medians and ratios (this checkout
÷ baseline).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def worker(service: str, model_dir: str, rows: int, context: int, threads: int, kernels: str, extra: int) -> None:
    sys.path[:0] = [service]
    import torch
    from cascade.codec.exact.model import ExactLlama

    torch.set_num_threads(threads)
    model = ExactLlama.from_pretrained(Path(model_dir), 1024, kernels=kernels)
    rng = random.Random(0)
    vocab = model.config.vocab_size
    sequences = [[rng.randrange(vocab) for _ in range(context)] for _ in range(rows)]
    cache = model.allocate_cache(rows, context + extra)
    model.prefill(sequences, cache, list(range(rows)))
    tokens = torch.tensor([s[-1] for s in sequences])
    model.logits(model.step(tokens, cache))  # the compiled kernels compile on first use
    model.logits(model.prefill(sequences[:1]))
    print("ready", flush=True)
    for line in sys.stdin:
        kind, count = line.split()
        start = time.perf_counter()
        if kind == "step":
            for _ in range(int(count)):
                model.logits(model.step(tokens, cache))
        else:
            model.logits(model.prefill(sequences[:int(count)]))
        print(json.dumps(time.perf_counter() - start), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("baseline", help="the other release's service/ folder")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kernels", default="fast")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--model-dir", default=str(REPO / "models" / "pycoder-23m"))
    parser.add_argument("--prefill", type=int, default=8, help="sequences of --context tokens prefilled a round")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    extra = args.rounds * args.steps + 8
    if args.worker:
        worker(args.worker, args.model_dir, args.rows, args.context, args.threads, args.kernels, extra)
        return
    trees = {"baseline": args.baseline, "this checkout": str(REPO / "service")}
    procs = {}
    for name, service in trees.items():
        command = [sys.executable, __file__, args.baseline, "--worker", service, "--rows", str(args.rows),
                   "--context", str(args.context), "--threads", str(args.threads), "--kernels", args.kernels,
                   "--rounds", str(args.rounds), "--steps", str(args.steps), "--model-dir", args.model_dir]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        procs[name] = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        for proc in procs.values():
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        times: dict[tuple[str, str], list[float]] = {(n, k): [] for n in trees for k in ("step", "prefill")}
        for r in range(args.rounds):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            for kind, count in (("step", args.steps), *((("prefill", args.prefill),) if args.prefill else ())):
                for name in order:
                    proc = procs[name]
                    assert proc.stdin is not None and proc.stdout is not None
                    proc.stdin.write(f"{kind} {count}\n")
                    proc.stdin.flush()
                    times[(name, kind)].append(json.loads(proc.stdout.readline()))
    finally:
        for proc in procs.values():
            if proc.stdin:
                proc.stdin.close()
            proc.wait(timeout=60)
    print(f"{Path(args.model_dir).name}, {args.rows} rows, context {args.context}, {args.threads} threads, "
          f"kernels={args.kernels}, {args.rounds} interleaved rounds (medians)")
    print("| tree | decode rows/s | prefill tok/s |")
    print("|---|---|---|")
    rates = {}
    for name in trees:
        step = args.rows * args.steps / statistics.median(times[(name, "step")])
        prefill = (args.prefill * args.context / statistics.median(times[(name, "prefill")])
                   if args.prefill else float("nan"))
        rates[name] = (step, prefill)
        print(f"| {name} | {step:,.0f} | {prefill:,.0f} |")
    new, base = rates["this checkout"], rates["baseline"]
    print(f"| ratio (this ÷ baseline) | {new[0] / base[0]:.3f} | {new[1] / base[1]:.3f} |")


if __name__ == "__main__":
    main()
