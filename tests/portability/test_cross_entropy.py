"""The exact model codes held-out text within 1 % of the float model's cross-entropy."""

from __future__ import annotations

import math
import sysconfig
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "models" / "pycoder-23m"


def _held_out_code(limit: int) -> str:
    """The model card's held-out packages: CPython's json/ and email/ were never trained on."""
    root = Path(sysconfig.get_paths()["stdlib"])
    text = "".join(p.read_text() for p in sorted((root / "json").glob("*.py")))
    return text[:limit]


def test_exact_cross_entropy_is_within_one_percent_of_float32() -> None:
    from cascade.codec.exact.model import ExactLlama
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(MODEL))
    ids = tokenizer.encode(_held_out_code(24_000), add_special_tokens=False)
    lanes = [[1, *ids[i:i + 511]] for i in range(0, len(ids) - 511, 511)][:8]
    reference = AutoModelForCausalLM.from_pretrained(str(MODEL), dtype=torch.float32).eval()
    exact = ExactLlama.from_pretrained(MODEL, 512)
    tokens = torch.tensor(lanes)
    with torch.no_grad():
        float_logits = reference(tokens).logits.double()
    exact_logits = (exact.logits(exact.prefill(lanes)).double() / 2**16).view(len(lanes), 512, -1)

    def bits(logits: torch.Tensor) -> float:
        logp = logits[:, :-1].log_softmax(-1)
        return float(-logp.gather(-1, tokens[:, 1:, None]).mean()) / math.log(2)

    ratio = bits(exact_logits) / bits(float_logits)
    assert ratio < 1.01, f"exact/float cross-entropy = {ratio:.5f}"
