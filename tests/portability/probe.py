"""Run in a subprocess under one numerics configuration; prints digests of everything the codec decides,
checks the drift known answer (pre-rounding digests) and the recorded exact-llama-1 digests of the
random-weight test models.

Everything is computed three ways in the same process — a text alone, among 63 other sequences in a
shuffled batch, and through decode steps after a prefix — and must agree before anything is
printed; the parent test then compares the digests across configurations (threads, ISA).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "service"), str(REPO)]

from cascade.codec.exact.cache import KVCache  # noqa: E402
from cascade.codec.exact.frequencies import frequency_tables  # noqa: E402
from cascade.codec.exact.known_answer import check_known_answer, reference_path  # noqa: E402
from cascade.codec.exact.model import ExactLlama  # noqa: E402
from cascade.codec.exact.runner import ExactRunner  # noqa: E402
from cascade.codec.lanes import lane_lengths, split_lanes  # noqa: E402
from cascade.engine.fingerprint import model_fingerprint  # noqa: E402

from tests.unit.codec.numerics_matrix import CONFIGS, DIGESTS, random_model, record  # noqa: E402

TEXTS = [
    'import os\n\n\ndef read_config(path):\n    """Read a key=value file into a dict."""\n    result = {}\n'
    "    with open(path) as handle:\n        for line in handle:\n            key, _, value = line.partition('=')\n"
    "            result[key.strip()] = value.strip()\n    return result\n",
    "NAME\n       tar - an archiving utility\n\nDESCRIPTION\n       GNU tar saves many files together into a single "
    "tape or disk archive, and can restore individual files from the archive.\n",
]


def digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.contiguous().numpy().tobytes()).hexdigest()[:16]


def main() -> None:
    from transformers import AutoTokenizer

    torch.set_num_threads(int(os.environ.get("CASCADE_PROBE_THREADS", torch.get_num_threads())))
    model_dir = REPO / "models" / "pycoder-23m"
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    kernels = os.environ.get("CASCADE_PROBE_KERNELS", "fast")
    model = ExactLlama.from_pretrained(model_dir, 512, kernels=kernels)
    texts = [[1, *tokenizer.encode(t, add_special_tokens=False)] for t in TEXTS]
    rng = random.Random(0)
    others = [[rng.randrange(8192) for _ in range(rng.randint(5, 120))] for _ in range(63)]
    out: dict[str, object] = {"threads": torch.get_num_threads(), "isa": torch.backends.cpu.get_cpu_capability(),
                              "kernels": model.kernel_summary()}
    for i, seq in enumerate(texts):
        alone = model.logits(model.prefill([seq]))
        batch = [*others, seq]
        rng.shuffle(batch)
        hidden = model.prefill(batch)
        at = batch.index(seq)
        start = sum(len(s) for s in batch[:at])
        among = model.logits(hidden[start:start + len(seq)])
        c = model.config
        cache = KVCache.allocate(1, len(seq), c.num_layers, c.num_kv_heads, c.head_dim)
        prefix = len(seq) // 3
        steps = [model.logits(model.prefill([seq[:prefix]], cache, [0])[-1:])]
        for token in seq[prefix:-1]:
            steps.append(model.logits(model.step(torch.tensor([token]), cache)))
        decoded = torch.cat(steps)
        assert torch.equal(alone, among), "batch composition changed the logits"
        assert torch.equal(alone[prefix - 1:-1], decoded), "decode steps differ from prefill"
        ids, cdf = frequency_tables(alone, 64, 32)
        out[f"text{i}"] = {"logits": digest(alone), "ids": digest(ids), "cdf": digest(cdf)}

    async def coded() -> list[str]:
        runner = ExactRunner(model, 8192, max_rows=8)
        try:
            results = []
            for seq in texts:
                lanes = split_lanes(seq[1:], 40)
                segment = await runner.encode([1], lanes, 64, 32)
                back = await runner.decode([1], lane_lengths(len(seq) - 1, 40), segment.payload, 64, 32)
                assert [t for lane in back for t in lane] == seq[1:], "round trip failed"
                results.append(segment.payload.hex())
            return results
        finally:
            runner.close()

    out["payloads"] = asyncio.run(coded())
    check_known_answer(model, reference_path(model_fingerprint(str(model_dir))))
    out["known_answer"] = "reproduced"
    expected = json.loads(DIGESTS.read_text())
    out["exact_llama_1_random_models"] = {name: record(random_model(name, kernels=kernels)) == expected[name]
                                          for name in CONFIGS}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
