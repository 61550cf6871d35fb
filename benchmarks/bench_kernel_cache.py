"""What the on-disk kernel cache saves a process that loads an exact model (``codec/exact/kernel_cache.py``).

    python benchmarks/bench_kernel_cache.py [--model-dir DIR ...] [--warm 3]

Each load runs in a fresh process (as a service start, a replica or a CLI run does), timed from
before ``ExactLlama.from_pretrained`` to a model whose compiled kernels are ready. "cold" is the first
process on an empty cache directory (what every process paid before the cache: compile and inspect
every kernel); "warm" the median of the next ``--warm`` processes, which load the kernels and their
verdicts. Each model gets its own empty directory (``NUMBA_CACHE_DIR`` in a temporary folder), so the
baseline is measured in the same run; the kernel set in use is printed, and both must be the same.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOAD = """
import json, sys, time
sys.path.insert(0, {service!r})
start = time.perf_counter()
from cascade.codec.exact.model import ExactLlama
model = ExactLlama.from_pretrained({model!r}, 1024)
print(json.dumps({{"seconds": time.perf_counter() - start, "kernels": model.kernel_summary()}}))
"""


def load(model_dir: Path, cache: Path) -> tuple[float, str]:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    code = LOAD.format(service=str(REPO / "service"), model=str(model_dir))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return float(result["seconds"]), str(result["kernels"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", type=Path, action="append",
                        help="exact model folders (default: models/pycoder-23m)")
    parser.add_argument("--warm", type=int, default=3, help="warm processes per model (median reported)")
    args = parser.parse_args()
    models = args.model_dir or [REPO / "models" / "pycoder-23m"]
    print("| model | cold load s (compile + inspect) | warm load s (median) | × | kernels |")
    print("|---|---|---|---|---|")
    for model_dir in models:
        with tempfile.TemporaryDirectory(prefix="kernel-cache-") as cache:
            cold, kernels = load(model_dir, Path(cache))
            warm_runs = [load(model_dir, Path(cache)) for _ in range(args.warm)]
        if any(k != kernels for _, k in warm_runs):
            raise SystemExit(f"the kernel set differs between cold and warm loads: {kernels} / {warm_runs}")
        warm = statistics.median(s for s, _ in warm_runs)
        print(f"| {model_dir.name} | {cold:.2f} | {warm:.2f} | {cold / warm:.1f} | {kernels} |")


if __name__ == "__main__":
    main()
