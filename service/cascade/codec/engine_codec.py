"""Codec ↔ engine adapter: teacher-forced encoding and bitstream-driven decoding of one segment.

Every segment is conditioned only on ``[</s>] + context`` (the model's document separator, as in
training, plus the container's optional context), so segments are independent: they encode and
decode in any order and in parallel, and a damaged segment never poisons the others.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cascade.codec.params import CodecArgs
from cascade.codec.range_coder import Encoder
from cascade.codec.topk_coding import encode_next_token
from cascade.engine.config import EngineRole

if TYPE_CHECKING:
    from cascade.engine.manager import EngineManager


class CodecEngineError(RuntimeError):
    """The engine did not produce what the codec needs (a bug or a dead engine, never bad input)."""


@dataclass(frozen=True)
class CodedSegment:
    payload: bytes
    tokens: int
    ideal_bits: float


def topk_entries(logprobs: dict[int, Any], k: int, forced: int) -> tuple[list[int], list[float]]:
    """The engine's top-k for one step. vLLM adds the sampled (here: forced) token when it is not in
    the top-k, so with k+1 entries that token is the extra one."""
    items = list(logprobs.items())
    if len(items) > k:
        items = [(t, lp) for t, lp in items if t != forced]
    items.sort(key=lambda kv: (-kv[1].logprob, kv[0]))
    items = items[:k]
    return [t for t, _ in items], [lp.logprob for _, lp in items]


def step_topk(logprobs: Any, step: int, k: int, chosen: int) -> tuple[Sequence[int], Sequence[float], float]:
    """The engine's top-k at ``step`` and the chosen token's log-probability.

    Reads vLLM's flat layout (per step: the chosen token, then the top-k; no ``Logprob`` objects,
    which at k = 1024 cost more than the coding), or the per-step dicts of the default layout.
    The order does not matter: ``build_distribution`` sorts canonically.
    """
    if hasattr(logprobs, "start_indices"):
        start, end = logprobs.start_indices[step], logprobs.end_indices[step]
        if end - start == k + 1 and logprobs.token_ids[start] == chosen:
            return logprobs.token_ids[start + 1:end], logprobs.logprobs[start + 1:end], logprobs.logprobs[start]
    entries = logprobs[step]
    ids, values = topk_entries(entries, k, chosen)
    return ids, values, entries[chosen].logprob


class EngineCodec:
    """Runs codec requests on the codec engine."""

    def __init__(self, engines: EngineManager, vocab_size: int, separator_id: int) -> None:
        self.engines = engines
        self.vocab_size = vocab_size
        self.separator_id = separator_id

    def prompt(self, context: Sequence[int]) -> list[int]:
        return [self.separator_id, *context]

    async def encode(self, tokens: Sequence[int], context: Sequence[int], top_k: int, precision_bits: int,
                     request_id: str, prompt: Sequence[int] | None = None) -> CodedSegment:
        """Teacher-force ``tokens`` after ``[</s>] + context`` (or after an explicit ``prompt``)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        args = CodecArgs("force", top_k=top_k, precision_bits=precision_bits, tokens=list(tokens))
        params = SamplingParams(max_tokens=len(tokens), temperature=0.0, logprobs=top_k, ignore_eos=True,
                                detokenize=False, output_kind=RequestOutputKind.DELTA, flat_logprobs=True,
                                extra_args=args.to_extra_args())
        encoder = Encoder()
        out = bytearray()
        position = 0
        ideal = 0.0
        start = list(prompt) if prompt is not None else self.prompt(context)
        async for output in self.engines.generate(start, params, request_id, EngineRole.CODEC):
            completion = output.outputs[0]
            if completion.logprobs is None or len(completion.logprobs) != len(completion.token_ids):
                raise CodecEngineError("the engine returned no log-probabilities for a coded token")
            for step, token in enumerate(completion.token_ids):
                if token != tokens[position]:
                    raise CodecEngineError(f"engine emitted token {token} at {position}, expected {tokens[position]}")
                ids, values, chosen = step_topk(completion.logprobs, step, top_k, token)
                out += encode_next_token(encoder, ids, values, token, self.vocab_size, precision_bits)
                ideal -= chosen / 0.6931471805599453
                position += 1
        if position != len(tokens):
            raise CodecEngineError(f"engine stopped after {position} of {len(tokens)} tokens")
        out += encoder.finish()
        return CodedSegment(bytes(out), len(tokens), ideal)

    async def decode(self, payload: bytes, n_tokens: int, context: Sequence[int], top_k: int, precision_bits: int,
                     request_id: str) -> list[int]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        args = CodecArgs("decode", top_k=top_k, precision_bits=precision_bits,
                         payload_b64=base64.b64encode(payload).decode())
        params = SamplingParams(max_tokens=n_tokens, temperature=0.0, ignore_eos=True, detokenize=False,
                                output_kind=RequestOutputKind.FINAL_ONLY, extra_args=args.to_extra_args())
        tokens: list[int] = []
        async for output in self.engines.generate(self.prompt(context), params, request_id, EngineRole.CODEC):
            tokens = list(output.outputs[0].token_ids)
        return tokens
