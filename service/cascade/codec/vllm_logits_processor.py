"""The codec inside vLLM's sampler: a V1 logits processor that forces each codec row's next token.

Two per-request modes, chosen by ``SamplingParams.extra_args["cascade_codec"]``:

- ``force``: teacher forcing through decode steps. The row's next token is the next token of the
  given text; the gateway reads the raw top-k log-probabilities vLLM returns for that step (which
  vLLM computes from the logits before any processor runs) and arithmetic-codes the token.
- ``decode``: the processor computes the same top-k log-probabilities from the row's logits, in the
  same way vLLM does (``log_softmax(dtype=float32)`` then ``topk``), decodes the next token from
  the request's bitstream and forces it. The engine's ordinary outputs then carry the decoded text.

Rows without codec args are untouched, so ordinary requests share the batch safely.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor

from cascade.codec.params import CODEC_EXTRA_ARGS_KEY, CodecArgs, CodecArgsError
from cascade.codec.range_coder import Decoder
from cascade.codec.topk_coding import decode_next_token


@dataclass
class _RowState:
    args: CodecArgs
    output_tokens: list[int]
    decoder: Decoder | None = None
    decoded: list[int] = field(default_factory=list)
    failed: bool = False


def _codec_args(params: Any) -> CodecArgs | None:
    extra = getattr(params, "extra_args", None) or {}
    raw = extra.get(CODEC_EXTRA_ARGS_KEY)
    return None if raw is None else CodecArgs.from_dict(raw)


class CodecLogitsProcessor(LogitsProcessor):
    """Registered through the ``vllm.logits_processors`` entry point (vLLM skips it on engines with
    speculative decoding, which is why the codec runs on an engine without it)."""

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        try:
            _codec_args(sampling_params)
        except CodecArgsError as exc:
            raise ValueError(f"invalid cascade_codec args: {exc}") from None

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, _RowState] = {}
        self.vocab_size = int(vllm_config.model_config.get_vocab_size())

    def live_rows(self) -> int:
        """Codec rows this processor holds state for (counted by the gateway's leak checks)."""
        return len(self.rows)

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, _prompt, output_tokens in batch_update.added:
            args = _codec_args(params)
            if args is None:
                self.rows.pop(index, None)
                continue
            state = _RowState(args, output_tokens)
            if args.mode == "decode":
                state.decoder = Decoder(base64.b64decode(args.payload_b64))
            self.rows[index] = state
        for a, b, direction in batch_update.moved:
            moved_a = self.rows.pop(a, None)
            moved_b = self.rows.pop(b, None)
            if moved_a is not None:
                self.rows[b] = moved_a
            if moved_b is not None and direction.name == "SWAP":
                self.rows[a] = moved_b

    def _next_token(self, state: _RowState, row_logits: torch.Tensor) -> int:
        step = len(state.output_tokens)
        if state.args.mode == "force":
            tokens = state.args.tokens
            return tokens[step] if step < len(tokens) else tokens[-1]
        if step < len(state.decoded):
            return state.decoded[step]
        logprobs = row_logits.unsqueeze(0).log_softmax(dim=-1, dtype=torch.float32)[0]
        values, ids = torch.topk(logprobs, min(state.args.top_k, logprobs.shape[-1]))
        assert state.decoder is not None
        token = decode_next_token(state.decoder, ids.tolist(), values.tolist(), self.vocab_size,
                                  state.args.precision_bits)
        state.decoded.append(token)
        return token

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        for index, state in self.rows.items():
            if index >= logits.shape[0]:
                continue
            token = 0
            if not state.failed:
                try:
                    token = self._next_token(state, logits[index])
                except Exception:
                    # An exception here would kill the engine process (and every request in it). A
                    # payload that cannot be decoded only spoils its own row: the forced token makes
                    # the segment fail its CRC in the gateway, which answers 422.
                    state.failed = True
                if not 0 <= token < logits.shape[1]:
                    state.failed = True
                token = 0 if state.failed else token
            logits[index].fill_(float("-inf"))
            logits[index, token] = 0.0
        return logits
