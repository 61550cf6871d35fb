"""Encode-while-sampling: arithmetic-code the tokens a normal sampled generation produces.

The engine returns each step's raw top-k log-probabilities next to the sampled token; coding the
token under them yields a bitstream from which the codec engine's decode mode regenerates the
identical tokens (bit-exact replay of a sampled generation). Run on the codec engine, so both
directions see the same fixed-shape decode steps.
"""

from __future__ import annotations

import base64
from typing import Any

from cascade.codec.engine_codec import topk_entries
from cascade.codec.range_coder import Encoder
from cascade.codec.topk_coding import encode_next_token


class SamplingEncoder:
    """Feeds on the engine's deltas; returns base64 chunks of the bitstream as bytes become final."""

    def __init__(self, top_k: int, precision_bits: int, vocab_size: int) -> None:
        self.top_k = top_k
        self.precision_bits = precision_bits
        self.vocab_size = vocab_size
        self.encoder = Encoder()
        self.tokens = 0
        self.data = bytearray()
        self.finished = False

    def _emit(self, out: bytes) -> list[str]:
        self.data += out
        return [base64.b64encode(out).decode()] if out else []

    def observe(self, completion: Any) -> list[str]:
        out = b""
        for token, logprobs in zip(completion.token_ids, completion.logprobs or [], strict=True):
            ids, values = topk_entries(logprobs, self.top_k, token)
            out += encode_next_token(self.encoder, ids, values, token, self.vocab_size, self.precision_bits)
            self.tokens += 1
        chunks = self._emit(out)
        if completion.finish_reason is not None and not self.finished:
            self.finished = True
            chunks += self._emit(self.encoder.finish())
        return chunks

    def summary(self) -> dict[str, Any]:
        """What a client sends back (``codec: {"mode": "decode", ...}``) to replay the generation."""
        return {"mode": "encode", "tokens": self.tokens, "top_k": self.top_k, "precision_bits": self.precision_bits,
                "data": base64.b64encode(bytes(self.data)).decode()}


class DecodeRecorder:
    """Decode mode: remembers the regenerated token ids, so a client can re-encode them exactly
    (text may re-tokenise differently) — e.g. to turn arbitrary bytes into text and back."""

    def __init__(self) -> None:
        self.token_ids: list[int] = []

    def observe(self, completion: Any) -> list[str]:
        self.token_ids.extend(completion.token_ids)
        return []

    def summary(self) -> dict[str, Any]:
        return {"mode": "decode", "tokens": len(self.token_ids), "token_ids": list(self.token_ids)}
