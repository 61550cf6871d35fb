"""Coder benchmark without an engine: overhead over the ideal code length, and tokens/s.

    PYTHONPATH=service python benchmarks/bench_coder.py [--tokens 4000] [--vocab 8192] [--repeat 3]

Synthetic but realistic positions: each step's logits are Zipf-like (``-α·log(rank)`` over a random
permutation of the vocabulary, α drawn in [1.1, 4], plus noise), so the top token usually holds
60–90 % of the mass as in a code model; the float32 log-softmax plays the engine's role and the
coded token is *sampled* from the full distribution, so tokens outside the top-k (escapes) occur.

Columns:
- ``table overhead``: expected extra bits of the integer frequency tables over the best coder for
  the codec's own model (float top-k probabilities, escape with the rest of the mass, then a
  uniform rank) — exact expectation over each position, no sampling noise;
- ``coded bits/tok`` and ``overhead (sampled)``: what was actually written for the sampled tokens
  (tables + coder + final flush) against that model's ideal length for the *same* tokens;
- ``per-token enc/dec``: one Python call per token from the top-k log-probabilities, as in the
  vLLM sampler (cascade: ``build_distribution`` + ``encode_token``/``decode_token``;
  constriction: ``exp`` + ``Categorical`` + its range coder), best of ``--repeat`` runs;
- ``coder only``: the range coders alone on prebuilt tables / models.

``constriction`` (Rust, 24-bit ``Categorical``) is measured in the same run when it imports.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from cascade.codec.distribution import Distribution, build_distribution
from cascade.codec.range_coder import Decoder, Encoder
from cascade.codec.token_coding import decode_token, encode_token

TOP_KS = (100, 1000, 8192)
PRECISIONS = (16, 24, 32)


@dataclass(frozen=True)
class Position:
    logprobs: np.ndarray
    token: int


@dataclass(frozen=True)
class Row:
    label: str
    table_overhead: float | None
    coded_bits: float
    sampled_ideal_bits: float
    token_rates: tuple[float, float]
    coder_rates: tuple[float, float]


def synthetic_positions(n: int, vocab: int, seed: int) -> list[Position]:
    rng = np.random.default_rng(seed)
    log_rank = np.log(np.arange(1, vocab + 1, dtype=np.float64))
    positions = []
    for _ in range(n):
        logits = np.empty(vocab)
        logits[rng.permutation(vocab)] = -rng.uniform(1.1, 4.0) * log_rank + rng.normal(0.0, 0.3, vocab)
        logprobs = logits - logits.max() - math.log(float(np.exp(logits - logits.max()).sum()))
        probs = np.exp(logprobs)
        positions.append(Position(logprobs.astype(np.float32), int(rng.choice(vocab, p=probs / probs.sum()))))
    return positions


def top_k(position: Position, k: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.argsort(-position.logprobs, kind="stable")[:k]
    return ids, position.logprobs[ids]


def model_probabilities(logprobs: np.ndarray, vocab: int) -> np.ndarray:
    """The codec's float model for one position's top-k: probabilities, then escape if k < vocab."""
    probs = np.exp(logprobs.astype(np.float64))
    return np.append(probs, max(1.0 - float(probs.sum()), 1e-300)) if probs.size < vocab else probs


def sampled_symbol(ids: np.ndarray, token: int) -> int:
    hit = np.flatnonzero(ids == token)
    return int(hit[0]) if hit.size else int(ids.size)


def best_time(fn: Callable[[], Any], repeat: int) -> tuple[Any, float]:
    best = math.inf
    value = None
    for _ in range(repeat):
        start = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - start)
    return value, best


TopK = tuple[np.ndarray, np.ndarray]


def sampled_ideal_bits(positions: list[Position], tops: list[TopK], vocab: int) -> float:
    total = 0.0
    for position, (ids, lps) in zip(positions, tops, strict=True):
        symbol = sampled_symbol(ids, position.token)
        total -= math.log2(float(model_probabilities(lps, vocab)[symbol]))
        if symbol == ids.size:
            total += math.log2(vocab - ids.size)
    return total


def table_overhead(positions: list[Position], dists: list[Distribution], vocab: int) -> float:
    """Expected extra bits of the integer tables over the float model, relative to the latter."""
    ideal = table = 0.0
    for position, dist in zip(positions, dists, strict=True):
        probs = model_probabilities(position.logprobs[dist.token_ids], vocab)
        escaped = dist.escape_index is not None
        fallback = probs[-1] * math.log2(vocab - dist.token_ids.size) if escaped else 0.0
        ideal += float(-(probs * np.log2(probs)).sum()) + fallback
        table += float(-(probs * np.log2(dist.frequencies / dist.total)).sum()) + fallback
    return table / ideal - 1


def bench_cascade(positions: list[Position], vocab: int, k: int, precision: int, repeat: int) -> Row:
    tops = [top_k(p, k) for p in positions]
    tokens = [p.token for p in positions]

    def encode() -> tuple[bytes, list[Distribution]]:
        encoder = Encoder()
        out = bytearray()
        dists = []
        for (ids, lps), token in zip(tops, tokens, strict=True):
            dist = build_distribution(ids, lps, vocab, precision)
            out += encode_token(encoder, dist, token, vocab)
            dists.append(dist)
        return bytes(out + encoder.finish()), dists

    (stream, dists), encode_s = best_time(encode, repeat)

    def decode() -> list[int]:
        decoder = Decoder(stream)
        return [decode_token(decoder, build_distribution(ids, lps, vocab, precision), vocab)
                for ids, lps in tops]

    decoded, decode_s = best_time(decode, repeat)
    assert decoded == tokens, "round trip failed"
    n = len(positions)
    intervals = [dist.interval(dist.symbol_for_token(t)) for dist, t in zip(dists, tokens, strict=True)]
    return Row(f"cascade, {precision}-bit", table_overhead(positions, dists, vocab), 8 * len(stream) / n,
               sampled_ideal_bits(positions, tops, vocab) / n, (n / encode_s, n / decode_s),
               coder_only_rates(intervals, precision, repeat))


def coder_only_rates(intervals: list[tuple[int, int]], precision: int, repeat: int) -> tuple[float, float]:
    def encode() -> bytes:
        encoder = Encoder()
        out = bytearray()
        for low, freq in intervals:
            out += encoder.encode(low, freq, precision)
        return bytes(out + encoder.finish())

    stream, encode_s = best_time(encode, repeat)

    def decode() -> None:
        decoder = Decoder(stream)
        for low, freq in intervals:
            decoder.decode_target(precision)
            decoder.consume(low, freq, precision)

    _, decode_s = best_time(decode, repeat)
    return len(intervals) / encode_s, len(intervals) / decode_s


def bench_constriction(positions: list[Position], vocab: int, k: int, repeat: int) -> Row | None:
    try:
        import constriction
    except ImportError:
        return None
    model = constriction.stream.model
    tops = [top_k(p, k) for p in positions]
    symbols = []
    for (ids, _), position in zip(tops, positions, strict=True):
        symbol = sampled_symbol(ids, position.token)
        rank = position.token - int(np.count_nonzero(ids < position.token)) if symbol == k else -1
        symbols.append((symbol, rank))
    uniform = model.Uniform(vocab - k) if k < vocab else None

    def categorical(models: list[Any] | None, i: int, logprobs: np.ndarray) -> Any:
        return models[i] if models else model.Categorical(model_probabilities(logprobs, vocab), perfect=False)

    def encode(models: list[Any] | None) -> np.ndarray:
        encoder = constriction.stream.queue.RangeEncoder()
        for i, ((_, lps), (symbol, rank)) in enumerate(zip(tops, symbols, strict=True)):
            encoder.encode(symbol, categorical(models, i, lps))
            if rank >= 0:
                encoder.encode(rank, uniform)
        compressed: np.ndarray = encoder.get_compressed()
        return compressed

    def decode(compressed: np.ndarray, models: list[Any] | None) -> list[tuple[int, int]]:
        decoder = constriction.stream.queue.RangeDecoder(compressed)
        out = []
        for i, (_, lps) in enumerate(tops):
            symbol = int(decoder.decode(categorical(models, i, lps)))
            out.append((symbol, int(decoder.decode(uniform)) if uniform is not None and symbol == k else -1))
        return out

    compressed, encode_s = best_time(lambda: encode(None), repeat)
    decoded, decode_s = best_time(lambda: decode(compressed, None), repeat)
    assert decoded == symbols, "constriction round trip failed"
    models = [model.Categorical(model_probabilities(lps, vocab), perfect=False) for _, lps in tops]
    _, coder_encode_s = best_time(lambda: encode(models), repeat)
    _, coder_decode_s = best_time(lambda: decode(compressed, models), repeat)
    n = len(positions)
    return Row("constriction, 24-bit", None, 32 * compressed.size / n,
               sampled_ideal_bits(positions, tops, vocab) / n, (n / encode_s, n / decode_s),
               (n / coder_encode_s, n / coder_decode_s))


def _cells(row: Row, reference: Row | None) -> list[str]:
    ratio = "—"
    if reference is not None and row is not reference:
        ratio = (f"{row.token_rates[0] / reference.token_rates[0]:.2f}× / "
                 f"{row.token_rates[1] / reference.token_rates[1]:.2f}×")
    return ["—" if row.table_overhead is None else f"{100 * row.table_overhead:.4f} %",
            f"{row.coded_bits:.4f}",
            f"{100 * (row.coded_bits / row.sampled_ideal_bits - 1):+.3f} %",
            f"{row.token_rates[0]:,.0f} / {row.token_rates[1]:,.0f}",
            f"{row.coder_rates[0]:,.0f} / {row.coder_rates[1]:,.0f}",
            ratio]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    positions = synthetic_positions(args.tokens, args.vocab, args.seed)
    entropy = sum(-float((np.exp(p.logprobs.astype(np.float64)) * p.logprobs).sum()) for p in positions)
    print(f"{args.tokens} sampled tokens, vocabulary {args.vocab}; model entropy "
          f"{entropy / math.log(2) / args.tokens:.4f} bits/token\n")
    print("| top-k | coder | table overhead (expected) | coded bits/tok | overhead (sampled) "
          "| per-token enc / dec tok/s | coder only enc / dec sym/s | per-token speed vs constriction |")
    print("|---|---|---|---|---|---|---|---|")
    for k in sorted({min(k, args.vocab) for k in TOP_KS}):
        reference = bench_constriction(positions, args.vocab, k, args.repeat)
        rows = [bench_cascade(positions, args.vocab, k, p, args.repeat) for p in PRECISIONS]
        for row in [*rows, *([reference] if reference else [])]:
            print(f"| {k} | {row.label} | " + " | ".join(_cells(row, reference)) + " |")


if __name__ == "__main__":
    main()
