"""What deploy/pip-install.sh's torch probe costs, against what adding PyTorch's CPU index to every
install would cost, on this machine's pip configuration (torch from a folder of local wheels,
PyTorch's index unreachable). Prints a table of seconds and ratios against the baseline measured
in the same run.

Rows (each the median of ``--repeats`` runs, in a fresh empty venv, nothing installed):
- baseline: one package lookup (``pip install --dry-run --no-deps six``), pip's configuration as is
- the same lookup with PyTorch's CPU index added (what an unconditional ``--extra-index-url`` costs per
  package: the full install looks up ~150)
- the probe alone (``pip install --dry-run --no-deps torch==2.13.0+cpu``)
- resolving the whole CPU install (``--dry-run .[cpu]``): plain pip (the install before the fix), and
  through deploy/pip-install.sh (probe + the same resolve)

    python benchmarks/bench_install.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTORCH_INDEX = "https://download.pytorch.org/whl/cpu"


def timed(cmd: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.monotonic()
        result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        times.append(time.monotonic() - started)
        if result.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{result.stderr[-2000:]}")
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "venv", tmp], check=True)
        python = str(Path(tmp) / "bin" / "python")
        pip = [python, "-m", "pip", "install", "--quiet", "--dry-run"]
        rows = [
            ("one lookup (six), pip's configuration", [*pip, "--no-deps", "six"]),
            ("one lookup (six) + PyTorch's CPU index", [*pip, "--no-deps", "--extra-index-url", PYTORCH_INDEX, "six"]),
            ("the probe alone (torch==2.13.0+cpu)", [*pip, "--no-deps", "torch==2.13.0+cpu"]),
            ("resolve .[cpu], plain pip (before)", [*pip, "--ignore-installed", ".[cpu]"]),
            ("resolve .[cpu], deploy/pip-install.sh", ["sh", "deploy/pip-install.sh", python, "--quiet", "--dry-run",
                                                       "--ignore-installed", ".[cpu]"]),
        ]
        results = [(name, timed(cmd, args.repeats)) for name, cmd in rows]
    baseline = results[0][1]
    print(f"| step (median of {args.repeats}) | seconds | × baseline |")
    print("|---|---:|---:|")
    for name, seconds in results:
        print(f"| {name} | {seconds:.2f} | {seconds / baseline:.1f} |")
    plain, scripted = results[3][1], results[4][1]
    print(f"\npip-install.sh over plain pip for the whole resolve: {scripted - plain:+.2f} s "
          f"({scripted / plain:.2f}×); PyTorch's index per lookup: {results[1][1] - baseline:+.2f} s")


if __name__ == "__main__":
    main()
