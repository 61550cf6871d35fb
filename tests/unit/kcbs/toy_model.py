"""A deterministic toy "model" and a brute-force k-CBS reference, so the search can be checked exactly.

Logits depend only on (seed, prefix), so the reference and the search see the same distributions without
sharing any code path beyond `logits()`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from cascade.kcbs import BeamRow, StepResult
from cascade.kcbs import EosPolicy as Policy

EOS = 0

Ids = tuple[int, ...]


@dataclass(frozen=True)
class ToyModel:
    seed: int
    vocab_size: int
    eos_token_id: int | None = EOS
    eos_bias: float = 1.0

    def logits(self, prefix: Ids) -> np.ndarray:
        rng = np.random.default_rng([self.seed, len(prefix), *prefix])
        logits = rng.normal(scale=2.0, size=self.vocab_size)
        if self.eos_token_id is not None:
            logits[self.eos_token_id] += self.eos_bias
        return logits

    def step_fn(self, k: int) -> ToyStep:
        return ToyStep(self, k)


@dataclass(frozen=True)
class ToyStep:
    """What an engine driver does: log_softmax, EOS masking, top-k; returned in a scrambled order."""

    model: ToyModel
    k: int

    def __call__(self, rows: list[BeamRow], mask_eos: bool) -> list[StepResult]:
        results: list[StepResult] = []
        for row in rows:
            logits = self.model.logits(row.token_ids)
            if mask_eos:
                assert self.model.eos_token_id is not None
                logits[self.model.eos_token_id] = -np.inf
            logprobs = logits - np.logaddexp.reduce(logits)
            top = np.argsort(-logprobs, kind="stable")[: self.k]
            top = top[np.isfinite(logprobs[top])]
            scrambled = np.random.default_rng([self.model.seed + 1, *row.token_ids]).permutation(top)
            results.append(([int(t) for t in scrambled], [float(logprobs[t]) for t in scrambled]))
        return results


def topk_children(model: ToyModel, prefix: Ids, k: int, mask_eos: bool) -> list[tuple[int, float]]:
    """The top-k next tokens with their top-k sampling probability (softmax over the k kept logits)."""
    logits = model.logits(prefix)
    allowed = [t for t in range(model.vocab_size) if not (mask_eos and t == model.eos_token_id)]
    top = sorted(allowed, key=lambda t: -logits[t])[:k]
    weights = np.exp(logits[top] - logits[top].max())
    return [(t, float(w)) for t, w in zip(top, weights / weights.sum(), strict=True)]


def _ends(model: ToyModel, policy: Policy, token: int) -> bool:
    return policy == "stop" and model.eos_token_id is not None and token == model.eos_token_id


def enumerate_sequences(model: ToyModel, k: int, steps: int, policy: Policy) -> dict[Ids, float]:
    """Every complete top-k-restricted sequence (length `steps`, or ended by EOS) with its probability."""
    mask = policy == "block" and model.eos_token_id is not None
    complete: dict[Ids, float] = {}
    frontier: list[tuple[Ids, float]] = [((), 1.0)]
    for depth in range(1, steps + 1):
        grown: list[tuple[Ids, float]] = []
        for prefix, probability in frontier:
            for token, p in topk_children(model, prefix, k, mask):
                sequence = (*prefix, token)
                if depth == steps or _ends(model, policy, token):
                    complete[sequence] = probability * p
                else:
                    grown.append((sequence, probability * p))
        frontier = grown
    return complete


@dataclass(frozen=True)
class RefBeam:
    token_ids: Ids
    score: float
    finished: bool


def reference_search(model: ToyModel, k: int, steps: int, final_prune: bool, policy: Policy) -> list[RefBeam]:
    """The beam rule written out directly: expand, sort by (−score, ids), prune (or not, at the end)."""
    mask = policy == "block" and model.eos_token_id is not None
    beam = [RefBeam((), 0.0, False)]
    for t in range(1, steps + 1):
        candidates: list[RefBeam] = []
        for b in beam:
            if b.finished:
                candidates.append(b)
                continue
            for token, p in topk_children(model, b.token_ids, k, mask):
                ended = _ends(model, policy, token)
                candidates.append(RefBeam((*b.token_ids, token), b.score + math.log(p), ended))
        candidates.sort(key=lambda c: (-c.score, c.token_ids))
        beam = candidates if (t == steps and not final_prune) else candidates[:k]
    return beam
