"""Encode-while-sampling: arithmetic-code the tokens an ordinary sampled generation produces.

The main engine samples as usual; the sampled tokens are then coded under the exact model's
distributions (one batched pass over prompt + completion), so ``codec: {"mode": "decode"}`` — run
by the exact runner, on any machine — regenerates the identical tokens (bit-exact replay of a
sampled generation). The engine's own float distributions never enter the code.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cascade.codec.pipeline import CodecPipeline


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
                                                      self.precision_bits, any_bytes=True)
        return [base64.b64encode(self.data).decode()]

    def summary(self) -> dict[str, Any]:
        """What a client sends back (``codec: {"mode": "decode", ...}``) to replay the generation."""
        return {"mode": "encode", "tokens": len(self.token_ids), "top_k": self.top_k,
                "precision_bits": self.precision_bits, "numerics": self.codec.numerics,
                "data": base64.b64encode(self.data).decode()}
