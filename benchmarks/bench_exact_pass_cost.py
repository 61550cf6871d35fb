"""What one exact multi-position pass costs against its rows and positions (speculative decoding's price).

    python benchmarks/bench_exact_pass_cost.py [--model-dir DIR] [--context 256] [--repeats 15]
        [--shapes 1x1,1x2,1x4,1x8,1x16,2x1,4x1] [--threads N]

Each shape ``R×P`` is R cache rows of ``--context`` cached positions, each fed P consecutive
positions in one ``ExactLlama.verify`` (what a decode step with a draft of P − 1 tokens runs), then
the integer logits and frequency tables of every fed position (what decoding them needs; the
runner builds a drafted position's only once the decoder reaches it, so a rejected draft costs
less than the "pass + tables" column). Shapes are timed interleaved (round-robin over the shapes,
``--repeats`` rounds), medians reported with the ratio to 1×1 measured in the same run. A pass
does not change the cache's lengths, so every repeat computes the same thing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "service"), str(REPO / "benchmarks")]

import torch  # noqa: E402
from bench_codec import MODEL_DIR  # noqa: E402
from cascade.codec.exact.cache import KVCache  # noqa: E402
from cascade.codec.exact.frequencies import frequency_tables  # noqa: E402
from cascade.codec.exact.model import ExactLlama  # noqa: E402
from cascade.codec.exact.runner import single_threaded  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", default=str(MODEL_DIR))
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--shapes", default="1x1,1x2,1x4,1x8,1x16,2x1,4x1")
    parser.add_argument("--top-k", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    model = single_threaded(ExactLlama.from_pretrained, args.model_dir, args.context + 64)
    if args.threads:
        torch.set_num_threads(args.threads)
    shapes = [(int(s.split("x")[0]), int(s.split("x")[1])) for s in args.shapes.split(",")]
    most_rows = max(r for r, _ in shapes)
    cache: KVCache = model.allocate_cache(most_rows, args.context + 32)
    generator = torch.Generator().manual_seed(0)
    context = torch.randint(0, model.config.vocab_size, (args.context,), generator=generator).tolist()
    model.prefill([context] * most_rows, cache, list(range(most_rows)))

    def one(rows: int, positions: int) -> tuple[float, float]:
        n = rows * positions
        tokens = torch.randint(0, model.config.vocab_size, (n,), generator=generator)
        row_ids = torch.arange(rows).repeat_interleave(positions)
        at = (args.context + torch.arange(positions)).repeat(rows)
        start = time.perf_counter()
        hidden = model.verify(tokens, cache, row_ids, at)
        passed = time.perf_counter()
        frequency_tables(model.logits(hidden), args.top_k, 32)
        return passed - start, time.perf_counter() - start

    for rows, positions in shapes:  # warm-up (compiled kernels, allocator)
        one(rows, positions)
    times: dict[tuple[int, int], list[tuple[float, float]]] = {s: [] for s in shapes}
    for _ in range(args.repeats):
        for rows, positions in shapes:
            times[(rows, positions)].append(one(rows, positions))
    base_pass = statistics.median(t[0] for t in times[(1, 1)])
    base_all = statistics.median(t[1] for t in times[(1, 1)])
    print(f"model {Path(args.model_dir).name}, {args.context} cached positions, top-k {args.top_k}, "
          f"{torch.get_num_threads()} threads, {args.repeats} interleaved rounds, medians")
    print("| rows × positions | pass ms | × 1×1 | pass + tables ms | × 1×1 | ms per position (pass + tables) |")
    print("|---|---|---|---|---|---|")
    for rows, positions in shapes:
        p = statistics.median(t[0] for t in times[(rows, positions)])
        a = statistics.median(t[1] for t in times[(rows, positions)])
        print(f"| {rows} × {positions} | {1e3 * p:.1f} | {p / base_pass:.2f} | {1e3 * a:.1f} | {a / base_all:.2f} "
              f"| {1e3 * a / (rows * positions):.1f} |")


if __name__ == "__main__":
    main()
