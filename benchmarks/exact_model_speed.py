"""CPU speed of the exact forward pass on pycoder-23m: prefill tokens/s and decode step rows/s.

Usage: ``python benchmarks/exact_model_speed.py [rows] [context]``. Prints one JSON line. Short on
purpose (a few seconds): a before/after check of the model, not the end-to-end benchmark.
"""

from __future__ import annotations

import json
import random
import sys
import time
import tracemalloc
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "service")]

from cascade.codec.exact.model import ExactLlama, KVCache  # noqa: E402


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    context = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    tracemalloc.start()
    model = ExactLlama.from_pretrained(REPO / "models" / "pycoder-23m", 1024)
    c = model.config
    rng = random.Random(0)
    sequences = [[rng.randrange(c.vocab_size) for _ in range(context)] for _ in range(rows)]
    model.logits(model.prefill(sequences[:1]))
    start = time.perf_counter()
    hidden = model.prefill(sequences[:8])
    model.logits(hidden)
    prefill_s = time.perf_counter() - start
    cache = KVCache.allocate(rows, context + 64, c.num_layers, c.num_kv_heads, c.head_dim)
    hidden = model.prefill(sequences, cache, list(range(rows)))
    tokens = torch.tensor([s[-1] for s in sequences])
    steps = 16
    start = time.perf_counter()
    for _ in range(steps):
        model.logits(model.step(tokens, cache))
    step_s = time.perf_counter() - start
    print(json.dumps({"threads": torch.get_num_threads(), "prefill_tokens_per_s": round(8 * context / prefill_s, 1),
                      "step_rows_per_s": round(rows * steps / step_s, 1), "rows": rows, "context": context}))


if __name__ == "__main__":
    main()
