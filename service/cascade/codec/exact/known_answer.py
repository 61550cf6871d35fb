"""Drift known answer: digests of the exact model's pre-rounding float64 intermediates.

A machine or device whose arithmetic differs from the reference by one ulp changes an integer logit
only when a value lies within that ulp of a rounding boundary (~2**-31 per logit): a short check of
final integers almost always passes on it, and rare segments of large containers then fail after a
whole segment's work. Every intermediate, though, differs at once. So this check runs a fixed token
sequence through packed prefill and a few decode steps and compares sha256 digests of every layer's
float64 output, of the final hidden states and of the logits *before* ``rint`` with a reference
recorded on the reference machine; the first intermediate that differs is named in the error.

The model computes RMSNorm's square root correctly rounded (``root``), so the digests pin every
operation bit for bit on any host. The root torch's CPU ``sqrt`` gives on this machine (MKL's vector
root, which earlier releases computed with and which differs between CPUs) is reported beside them:
``check_known_answer`` returns, and logs, a note when its variant is not the reference machine's.

References ship in ``known_answers/`` (package data), one JSON file per model fingerprint. For a
model folder without one: ``python -m cascade.record_known_answer MODEL_DIR`` writes it.
``check_known_answer(model, reference_path)`` is what the codec's start-up self-test calls.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import torch

from cascade.codec.exact import root
from cascade.codec.exact.model import NUMERICS_VERSION, ExactLlama

REFERENCES = Path(__file__).with_name("known_answers")
FORMAT = 2
logger = logging.getLogger("cascade.codec")
_STEPS = 4


class KnownAnswerError(RuntimeError):
    """The exact arithmetic here differs from the reference machine's (the message names where)."""


def _tokens(vocab: int, count: int, seed: int) -> list[int]:
    """A fixed pseudo-random token sequence (no tokenizer needed): a 64-bit LCG, ids mod ``vocab``."""
    state, out = seed, []
    for _ in range(count):
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append((state >> 33) % vocab)
    return out


def _digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().to("cpu").contiguous().numpy().tobytes()).hexdigest()


def intermediates(model: ExactLlama) -> dict[str, str]:
    """Digests, in computation order, of every layer's output, the final hidden states and the
    logits before rounding: packed prefill of two sequences (41 and 17 tokens) into a KV cache,
    then ``_STEPS`` decode steps of both rows."""
    vocab = model.config.vocab_size
    sequences = [_tokens(vocab, 41 + _STEPS, 1), _tokens(vocab, 17 + _STEPS, 2)]
    out: dict[str, str] = {}
    stage = ["prefill"]

    def trace(name: str, x: torch.Tensor) -> None:
        out[f"{stage[0]}.{name}"] = _digest(x)

    previous = model.trace
    model.trace = trace
    try:
        cache = model.allocate_cache(2, max(len(s) for s in sequences))
        hidden = model.prefill([s[:-_STEPS] for s in sequences], cache, [0, 1])
        out["prefill.hidden"] = _digest(hidden)
        out["prefill.logits_before_rint"] = _digest(model.logits_before_rounding(hidden))
        for t in range(_STEPS):
            stage[0] = f"step{t + 1}"
            tokens = torch.tensor([s[len(s) - _STEPS + t] for s in sequences])
            hidden = model.step(tokens, cache)
            out[f"step{t + 1}.hidden"] = _digest(hidden)
            out[f"step{t + 1}.logits_before_rint"] = _digest(model.logits_before_rounding(hidden))
    finally:
        model.trace = previous
    return out


def reference(model: ExactLlama) -> dict[str, Any]:
    """The reference document for ``model`` as this machine computes it."""
    return {"format": FORMAT, "numerics": NUMERICS_VERSION, "vocab_size": model.config.vocab_size,
            "layers": model.config.num_layers, "root_variant": root.variant(),
            "intermediates": intermediates(model)}


def check_known_answer(model: ExactLlama, reference_path: str | Path) -> str | None:
    """Raise ``KnownAnswerError`` unless this machine reproduces ``reference_path``'s digests bit for
    bit (the message names the first intermediate that differs). Returns, and logs, a note when this
    machine's square root is another variant than the reference machine's; None otherwise."""
    path = Path(reference_path)
    expected = json.loads(path.read_text())
    if expected.get("format") != FORMAT or expected.get("numerics") != NUMERICS_VERSION:
        raise KnownAnswerError(f"{path.name} is a known answer for numerics {expected.get('numerics')!r} "
                               f"(format {expected.get('format')}), this codec computes {NUMERICS_VERSION!r}")
    if (expected["vocab_size"], expected["layers"]) != (model.config.vocab_size, model.config.num_layers):
        raise KnownAnswerError(f"{path.name} was recorded for another model")
    got = intermediates(model)
    for name, digest in expected["intermediates"].items():
        if got.get(name) != digest:
            raise KnownAnswerError(f"made under different numerics: the exact model's {name} differs from the "
                                   f"reference machine's ({path.name}); this machine's arithmetic would make and "
                                   "read other containers")
    if set(got) != set(expected["intermediates"]):
        raise KnownAnswerError(f"{path.name} lists other intermediates than this model computes")
    here = root.variant()
    if here == expected.get("root_variant"):
        return None
    note = (f"this machine's torch square root is variant {here}, the reference machine's "
            f"{expected.get('root_variant')}: the codec computes with the correctly rounded root, the same "
            "everywhere; a segment that an earlier release wrote on another machine may, at a rare position, "
            "fail its checksum with a clear error (docs/architecture.md, 'The square root')")
    logger.warning(note)
    return note


def reference_path(fingerprint: bytes) -> Path:
    """Where the shipped reference for a model fingerprint lives (it may not exist)."""
    return REFERENCES / f"{fingerprint.hex()[:32]}.json"


def write_reference(model_dir: str | Path, fingerprint: bytes, out: str | Path | None = None,
                    device: str = "cpu") -> Path:
    """Record the known answer of the model in ``model_dir`` on this machine (the reference machine)
    and write it to ``out`` (default: the shipped location for its ``fingerprint``)."""
    model = ExactLlama.from_pretrained(model_dir, 64, device)
    path = Path(out) if out else reference_path(fingerprint)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(reference(model), indent=1) + "\n")
    return path
