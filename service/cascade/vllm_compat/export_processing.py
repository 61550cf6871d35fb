"""The sampling stack, applied to teacher-forced prompt logits (runs inside the engine process).

vLLM scores prompt positions with raw logits ("prompt tokens skip sampling processors"). For an
export the user asks for the distribution the sampler would draw from, so this applies the same
steps in vLLM's order: allowed-token mask, bad words, logit bias, temperature, min-p, then the
top-k/top-p masks (computed on each row's best candidates only, see ``_truncation_mask``).
Penalties and ``min_tokens`` depend on generated tokens and are refused at the API, so they never
reach here. ``cascade.vllm_compat.export_hook`` calls this from inside vLLM's prompt-logprobs step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch


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


def _truncation_mask(logits: torch.Tensor, params: Any, keep: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Among each row's ``keep`` most likely tokens, which survive min-p, top-k and top-p.

    Equivalent to vLLM's masks for every token an export can return (it returns at most ``keep``
    per row), without sorting the vocabulary: min-p keeps ``logit >= max + log(min_p)``; top-k
    keeps every token at least as likely as the ``top_k``-th, so tokens tied with it all survive
    (vLLM's sampler masks only ``logit < k-th value``; bf16 logits tie often); top-p (on the
    distribution left by the first two, as in vLLM) keeps a token while the probability of the
    tokens strictly ahead of it is below ``top_p``.
    """
    values, ids = logits.topk(keep, dim=-1)
    alive = torch.ones_like(values, dtype=torch.bool)
    floor = None
    if params.min_p:
        floor = values[:, :1] + math.log(params.min_p)
        alive &= values >= floor
    vocab = logits.shape[1]
    top_k = params.top_k if params.top_k and 0 < params.top_k < vocab else None
    if top_k is not None:
        kth = values[:, top_k - 1:top_k]
        alive &= values >= kth
        floor = kth if floor is None else torch.maximum(floor, kth)
    if params.top_p < 1.0:
        if floor is not None:
            normaliser = torch.logsumexp(logits.masked_fill(logits < floor, float("-inf")), dim=-1, keepdim=True)
        else:
            normaliser = torch.logsumexp(logits, dim=-1, keepdim=True)
        probs = (values - normaliser).exp().masked_fill(~alive, 0.0)
        ahead = torch.cumsum(probs, dim=-1) - probs
        alive &= ahead < params.top_p
        alive[:, 0] = True
    return ids, alive


def process_prompt_logits(logits: torch.Tensor, params: Any, prompt: Sequence[int], first_context: int,
                          keep: int) -> torch.Tensor:
    """Processed logits for prompt rows; row ``j`` conditions on ``prompt[:first_context + j]``.

    Tokens outside each row's ``keep`` best are set to ``-inf`` when a truncation is active (the
    export never returns them); otherwise the row is the full processed distribution."""
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
    truncating = params.min_p or (params.top_k and 0 < params.top_k < out.shape[1]) or params.top_p < 1.0
    if not truncating:
        return out
    ids, alive = _truncation_mask(out, params, min(max(keep, params.top_k or 0), out.shape[1]))
    kept = torch.full_like(out, float("-inf"))
    kept.scatter_(1, ids, out.gather(1, ids).masked_fill(~alive, float("-inf")))
    _keep_surviving_targets(out, kept, params, prompt, first_context)
    return kept


def _keep_surviving_targets(out: torch.Tensor, kept: torch.Tensor, params: Any, prompt: Sequence[int],
                            first_context: int) -> None:
    """Where a row's actual token survives min-p, top-k and top-p but lies beyond the ``keep`` best,
    keep it and every token ahead of it finite, so the engine reports its true rank (the export
    still returns only its K best; those ahead of a survivor survive too, the masks are monotone)."""
    rows = min(out.shape[0], len(prompt) - first_context)
    if rows <= 0:
        return
    targets = torch.tensor(list(prompt[first_context:first_context + rows]), device=out.device, dtype=torch.long)
    logits = out[:rows]
    target_logit = logits.gather(1, targets[:, None])
    beyond = ~torch.isfinite(kept[:rows].gather(1, targets[:, None]))[:, 0] & torch.isfinite(target_logit)[:, 0]
    if not bool(beyond.any()):
        return
    logits, target_logit = logits[beyond], target_logit[beyond]
    ahead = logits > target_logit
    survives = torch.ones(logits.shape[0], dtype=torch.bool, device=out.device)
    alive = torch.ones_like(logits, dtype=torch.bool)
    if params.min_p:
        floor = logits.max(dim=-1, keepdim=True).values + math.log(params.min_p)
        survives &= (target_logit >= floor)[:, 0]
        alive &= logits >= floor
    vocab = out.shape[1]
    if params.top_k and 0 < params.top_k < vocab:
        survives &= ahead.sum(dim=-1) < params.top_k
    if params.top_p < 1.0:
        if params.top_k and 0 < params.top_k < vocab:
            alive &= logits >= logits.topk(params.top_k, dim=-1).values[:, -1:]
        masked = logits.masked_fill(~alive, float("-inf"))
        log_ahead = torch.logsumexp(masked.masked_fill(~ahead, float("-inf")), dim=-1)
        survives &= (log_ahead - torch.logsumexp(masked, dim=-1)).exp() < params.top_p
    if not bool(survives.any()):
        return
    row_index = torch.nonzero(beyond)[:, 0][survives]
    chosen = logits[survives]
    kept[row_index] = chosen.masked_fill(chosen < target_logit[survives], float("-inf"))
