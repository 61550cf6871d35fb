"""Typed per-request codec arguments carried in ``SamplingParams.extra_args`` (Python API helper)."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any, Literal

from cascade.codec.distribution import PRECISIONS

CODEC_EXTRA_ARGS_KEY = "cascade_codec"


class CodecArgsError(ValueError):
    """The ``cascade_codec`` extra args are malformed."""


@dataclass(frozen=True)
class CodecArgs:
    """``force``: make the engine emit ``tokens`` (teacher forcing). ``decode``: regenerate tokens
    from ``payload_b64`` (an arithmetic-coded stream) under top-``top_k`` at ``precision_bits``."""

    mode: Literal["force", "decode"]
    top_k: int = 64
    precision_bits: int = 32
    tokens: list[int] = field(default_factory=list)
    payload_b64: str = ""

    def to_extra_args(self) -> dict[str, Any]:
        """``SamplingParams(extra_args=CodecArgs(...).to_extra_args())``."""
        return {CODEC_EXTRA_ARGS_KEY: {"mode": self.mode, "top_k": self.top_k,
                                       "precision_bits": self.precision_bits, "tokens": list(self.tokens),
                                       "payload_b64": self.payload_b64}}

    @classmethod
    def from_dict(cls, raw: Any) -> CodecArgs:
        if not isinstance(raw, dict):
            raise CodecArgsError("cascade_codec must be an object")
        mode = raw.get("mode")
        if mode not in ("force", "decode"):
            raise CodecArgsError("mode must be 'force' or 'decode'")
        top_k = raw.get("top_k", 64)
        precision = raw.get("precision_bits", 32)
        if not isinstance(top_k, int) or top_k < 1:
            raise CodecArgsError("top_k must be a positive integer")
        if precision not in PRECISIONS:
            raise CodecArgsError(f"precision_bits must be one of {PRECISIONS}")
        tokens = raw.get("tokens", [])
        if not isinstance(tokens, list) or not all(isinstance(t, int) and t >= 0 for t in tokens):
            raise CodecArgsError("tokens must be a list of token ids")
        if mode == "force" and not tokens:
            raise CodecArgsError("force mode needs tokens")
        payload = raw.get("payload_b64", "")
        if mode == "decode":
            try:
                base64.b64decode(payload, validate=True)
            except (binascii.Error, TypeError, ValueError):
                raise CodecArgsError("payload_b64 is not valid base64") from None
        return cls(mode, top_k, precision, tokens, payload)
