"""Where one exact decode step's time goes on a device (bench-only; a lent GPU machine has torch, no vLLM).

    python benchmarks/gpu/decode_step_profile.py --device cuda|cpu [--kernels fast|reference] [--steps 50]

One row with a 300-token context, then ``--steps`` decode steps: the model's pass alone
(host time to issue it, and time until the device finished), the pass plus integer logits and the
coding tables copied to the host (what a decode step of the runner waits for), both again as the
fixed-shape pass of ``graphs.GraphedVerify`` (replayed as a CUDA graph on a GPU), and a profiler table of
a few eager steps (op counts, host and device time per op), so a launch-bound step shows as its op count.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "service")]

from cascade.codec.exact.frequencies import frequency_tables  # noqa: E402
from cascade.codec.exact.graphs import GraphedVerify  # noqa: E402
from cascade.codec.exact.model import ExactLlama  # noqa: E402


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), required=True)
    parser.add_argument("--kernels", default="fast")
    parser.add_argument("--model", type=Path, default=REPO / "models" / "pycoder-23m")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    model = ExactLlama.from_pretrained(args.model, 1024, args.device, args.kernels)
    print(f"{model.device}, {model.kernel_summary()}, torch {torch.__version__}", flush=True)
    cache = model.allocate_cache(args.rows, 1024)
    model.prefill([list(range(100, 400))] * args.rows, cache, list(range(args.rows)))
    token = torch.full((args.rows,), 42, dtype=torch.int64, device=model.device)

    graphed = GraphedVerify(model)
    rows = list(range(args.rows))

    def step(tables: bool, graphs: bool = False) -> None:
        # the fixed-shape pass feeds one token per row at position 300 each time: a step's work
        hidden = graphed([42] * args.rows, rows, [300] * args.rows, cache) if graphs else model.step(token, cache)
        if tables:
            ids, cdf = frequency_tables(model.logits(hidden), 1024, 32)
            ids.cpu(), cdf.cpu()

    for graphs in (False, True):  # warm-up: lazy set-up, and each graph shape captured
        for _ in range(3):
            step(True, graphs)
    lines = []
    for tables, graphs in ((False, False), (True, False), (False, True), (True, True)):
        sync()
        start = time.perf_counter()
        for _ in range(args.steps):
            step(tables, graphs)
        issued = time.perf_counter()
        sync()
        done = time.perf_counter()
        lines.append(f"{'pass + logits + tables to host' if tables else 'pass alone'}"
                     f"{(', CUDA graph' if graphed.capture else ', fixed shape') if graphs else ''}: "
                     f"{(issued - start) / args.steps * 1e3:.2f} ms/step to issue, "
                     f"{(done - start) / args.steps * 1e3:.2f} ms/step to finish")
    print("\n".join(lines), flush=True)
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        for _ in range(5):
            step(True)
        sync()
    events = prof.key_averages()
    report = ["\n".join(lines), "profiler, 5 steps with tables:",
              events.table(sort_by="self_cpu_time_total", row_limit=45)]
    if torch.cuda.is_available():
        report.append(events.table(sort_by="self_cuda_time_total", row_limit=20))
    text = "\n\n".join(report)
    print(text, flush=True)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
