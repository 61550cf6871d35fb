"""The sampling stack, applied to teacher-forced prompt logits (runs inside the engine process).

vLLM scores prompt positions with raw logits ("prompt tokens skip sampling processors"). For an
export the user asks for the distribution the sampler would draw from, so this applies the same
steps in vLLM's order: allowed-token mask, bad words, logit bias, temperature, min-p, then vLLM's
own top-k/top-p masking. Penalties and ``min_tokens`` depend on generated tokens and are refused
at the API, so they never reach here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

EXPORT_KEY = "cascade_export"


def is_export_request(sampling_params: Any) -> bool:
    extra = getattr(sampling_params, "extra_args", None) or {}
    return bool(extra.get(EXPORT_KEY))


def _ban_bad_words(logits: torch.Tensor, bad_words: Sequence[Sequence[int]], prompt: Sequence[int],
                   first_context: int) -> None:
    """Row ``j`` predicts the token after ``prompt[:first_context + j]``: ban each bad word's last
    token where the context ends with the word's other tokens (what vLLM does for outputs)."""
    for word in bad_words:
        *prefix, last = word
        if not prefix:
            logits[:, last] = float("-inf")
            continue
        n = len(prefix)
        for row in range(logits.shape[0]):
            end = first_context + row
            if end >= n and list(prompt[end - n: end]) == prefix:
                logits[row, last] = float("-inf")


def process_prompt_logits(logits: torch.Tensor, params: Any, prompt: Sequence[int], first_context: int) -> torch.Tensor:
    """Processed logits for prompt rows; row ``j`` conditions on ``prompt[:first_context + j]``."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    out = logits.to(torch.float32)
    if params.allowed_token_ids:
        allowed = torch.full((out.shape[1],), float("-inf"), device=out.device)
        allowed[list(params.allowed_token_ids)] = 0.0
        out = out + allowed
    bad_words = getattr(params, "bad_words_token_ids", None)
    if bad_words:
        _ban_bad_words(out, bad_words, prompt, first_context)
    if params.logit_bias:
        ids = torch.tensor(list(params.logit_bias.keys()), device=out.device, dtype=torch.long)
        out[:, ids] += torch.tensor(list(params.logit_bias.values()), device=out.device, dtype=torch.float32)
    out = out / float(params.temperature)
    if params.min_p:
        probs = out.softmax(dim=-1)
        out = out.masked_fill(probs < params.min_p * probs.amax(dim=-1, keepdim=True), float("-inf"))
    rows = out.shape[0]
    top_k = params.top_k if params.top_k and 0 < params.top_k < out.shape[1] else None
    top_p = params.top_p if params.top_p < 1.0 else None
    if top_k is not None or top_p is not None:
        k = torch.full((rows,), top_k, dtype=torch.long, device=out.device) if top_k is not None else None
        p = torch.full((rows,), top_p, dtype=torch.float32, device=out.device) if top_p is not None else None
        out = apply_top_k_top_p(out, k, p)
    return out
