"""CPU speed and memory of the exact forward pass on pycoder-23m: prefill tokens/s, decode step
rows/s, and the bytes the exact model holds.

Usage: ``python benchmarks/exact_model_speed.py [rows] [context] [threads] [fast|reference]`` (the
last: the model's kernels, ``codec_kernels``; releases before it ignore it); ``CASCADE_SERVICE``
points at another checkout's ``service/`` (to compare releases). Prints one JSON line. Short on
purpose (seconds): a before/after check of the model, not the end-to-end benchmark.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [os.environ.get("CASCADE_SERVICE", str(REPO / "service"))]

from cascade.codec.exact.model import ExactLlama  # noqa: E402


def tensor_bytes(obj: Any, seen: set[int] | None = None) -> int:
    """Bytes of every distinct tensor reachable from ``obj`` (attributes, lists, dicts)."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        key = obj.untyped_storage().data_ptr()
        if key in seen:
            return 0
        seen.add(key)
        return obj.untyped_storage().nbytes()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v, seen) for v in obj)
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        return sum(tensor_bytes(v, seen) for v in vars(obj).values())
    return 0


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    context = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    if len(sys.argv) > 3:
        torch.set_num_threads(int(sys.argv[3]))
    options = {"kernels": sys.argv[4]} if len(sys.argv) > 4 else {}
    model = ExactLlama.from_pretrained(REPO / "models" / "pycoder-23m", 1024, **options)
    c = model.config
    rng = random.Random(0)
    sequences = [[rng.randrange(c.vocab_size) for _ in range(context)] for _ in range(rows)]
    model.logits(model.prefill(sequences[:1]))
    start = time.perf_counter()
    model.logits(model.prefill(sequences[:8]))
    prefill_s = time.perf_counter() - start
    cache = model.allocate_cache(rows, context + 64)
    model.prefill(sequences, cache, list(range(rows)))
    tokens = torch.tensor([s[-1] for s in sequences])
    steps = 16
    model.logits(model.step(tokens, cache))  # warm-up: the fast kernels compile on first use
    start = time.perf_counter()
    for _ in range(steps):
        model.logits(model.step(tokens, cache))
    step_s = time.perf_counter() - start
    kv = sum(t.untyped_storage().nbytes() for t in [*cache.keys, *cache.values]) // (rows * (context + 64))
    print(json.dumps({"kernels": options.get("kernels", "default"), "threads": torch.get_num_threads(),
                      "prefill_tokens_per_s": round(8 * context / prefill_s, 1),
                      "step_rows_per_s": round(rows * steps / step_s, 1), "rows": rows, "context": context,
                      "model_mb": round(tensor_bytes(model) / 2**20, 1), "kv_bytes_per_row_position": kv}))


if __name__ == "__main__":
    main()
