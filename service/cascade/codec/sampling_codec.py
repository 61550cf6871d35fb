"""Encode-while-sampling: arithmetic-code the tokens an ordinary sampled generation produces.

The main engine samples as usual; the sampled tokens are then coded under the exact model's
distributions (one batched pass over prompt + completion), so ``codec: {"mode": "decode"}`` — run
by the exact runner, on any machine — regenerates the identical tokens (bit-exact replay of a
sampled generation). The engine's own float distributions never enter the code.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from cascade.codec.pipeline import CodecPipeline


CHECK_VERSION = 1


def ids_sha256(ids: Sequence[int]) -> str:
    """SHA-256 (hex) of token ids, each as an unsigned 32-bit little-endian integer, concatenated."""
    return hashlib.sha256(struct.pack(f"<{len(ids)}I", *ids)).hexdigest()


def replay_check(codec: CodecPipeline, prompt: Sequence[int], token_ids: Sequence[int]) -> dict[str, Any]:
    """The ``check`` of an encode-mode object: what decode mode must reproduce (docs/codec-format.md)."""
    return {"version": CHECK_VERSION, "model": codec.fingerprint.hex(), "numerics": codec.numerics,
            "prompt_sha256": ids_sha256(prompt), "tokens_sha256": ids_sha256(token_ids)}


class ReplayCheck(Protocol):
    """A ``check`` sent back with decode mode (the API's ``CodecCheck``)."""

    model: str
    numerics: str
    prompt_sha256: str
    tokens_sha256: str


class ReplayMismatchError(ValueError):
    """A replay object's ``check`` does not hold here. ``status``: 409 (another model or numerics) or
    422 (another prompt, or data that does not decode to the recorded tokens); ``param`` names the field."""

    def __init__(self, status: int, message: str, code: str, param: str) -> None:
        super().__init__(message)
        self.status, self.code, self.param = status, code, param


def check_identity(check: ReplayCheck, codec: CodecPipeline, prompt: Sequence[int]) -> None:
    """Everything a check says that can be verified before decoding: numerics, model, prompt."""
    if check.numerics != codec.numerics:
        raise ReplayMismatchError(409, f"codec.data was made under different numerics ({check.numerics!r}; this "
                                       f"server computes {codec.numerics!r})", "numerics_mismatch", "codec.check")
    if check.model != codec.fingerprint.hex():
        raise ReplayMismatchError(409, f"codec.data was made with model fingerprint {check.model[:16]}…, this "
                                       f"server runs {codec.fingerprint.hex()[:16]}…", "model_mismatch",
                                  "codec.check")
    if check.prompt_sha256 != ids_sha256(prompt):
        raise ReplayMismatchError(422, "the prompt is not the one codec.data was made after (codec.check."
                                       "prompt_sha256 differs)", "replay_mismatch", "prompt")


def check_tokens(check: ReplayCheck, token_ids: Sequence[int]) -> None:
    """After decoding: the ids must be the recorded ones, else the data (or tokens/top_k/precision_bits)
    was altered and the text would be wrong."""
    if check.tokens_sha256 != ids_sha256(token_ids):
        raise ReplayMismatchError(422, "codec.data does not decode to the tokens it was made from (damaged, "
                                       "truncated, or sent with other tokens/top_k/precision_bits)",
                                  "replay_mismatch", "codec.data")


def check_canonical(data: bytes, recoded: bytes) -> None:
    """After ``check_tokens``: the data must be the very code of its tokens. Coding is deterministic
    (the same tokens give the same bytes), so this refuses what decodes to the right tokens anyway — a
    changed bit in the last byte's slack, bytes appended after the code."""
    if data != recoded:
        raise ReplayMismatchError(422, "codec.data is not the code of the tokens it decodes to (bytes changed or "
                                       "appended after it was made)", "replay_mismatch", "codec.data")


class SamplingEncoder:
    """Collects the sampled tokens; ``finish`` codes them and returns the base64 chunk of the bitstream."""

    def __init__(self, codec: CodecPipeline, prompt: list[int], top_k: int, precision_bits: int) -> None:
        self.codec = codec
        self.prompt = prompt
        self.top_k = top_k
        self.precision_bits = precision_bits
        self.token_ids: list[int] = []
        self.data = b""
        self.finished = False

    def observe(self, token_ids: Sequence[int]) -> None:
        self.token_ids.extend(token_ids)

    async def finish(self) -> list[str]:
        if self.finished or not self.token_ids:
            self.finished = True
            return []
        self.finished = True
        self.data, _ = await self.codec.encode_tokens(self.prompt, self.token_ids, len(self.token_ids), self.top_k,
                                                      self.precision_bits, any_bytes=True,
                                                      weighted_escapes=False)
        return [base64.b64encode(self.data).decode()]

    def summary(self) -> dict[str, Any]:
        """What a client sends back (``codec: {"mode": "decode", ...}``) to replay the generation."""
        return {"mode": "encode", "tokens": len(self.token_ids), "top_k": self.top_k,
                "precision_bits": self.precision_bits, "numerics": self.codec.numerics,
                "data": base64.b64encode(self.data).decode(),
                "check": replay_check(self.codec, self.prompt, self.token_ids)}
