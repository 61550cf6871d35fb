"""vLLM's ``RequestOutput`` → Cascade's ``Generation`` (the only gateway module that reads vLLM outputs)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cascade.engine.types import Candidate, CompletionDelta, Generation, PredictionCounts, TokenLogprobs
from cascade.export.topk import ExportPosition, positions_from_prompt_logprobs


def _token_logprobs(token_ids: Sequence[int], logprobs: Sequence[Any] | None) -> tuple[TokenLogprobs, ...] | None:
    """Per sampled token, vLLM's dict of the top-n plus the sampled token, ranked best first (stable
    on vLLM's order for equal values)."""
    if logprobs is None:
        return None
    entries = []
    for token_id, position in zip(token_ids, logprobs, strict=False):
        chosen = position[token_id]
        ranked = sorted(position.items(), key=lambda item: -item[1].logprob)
        entries.append(TokenLogprobs(token_id, chosen.decoded_token or "", chosen.logprob,
                                     tuple(Candidate(t, lp.decoded_token or "", lp.logprob, lp.rank)
                                           for t, lp in ranked), chosen.rank))
    return tuple(entries)


def _prediction_counts(completion: Any) -> PredictionCounts | None:
    """vLLM's per-request spec-decode summary: a histogram of accepted draft lengths per step."""
    metrics = getattr(completion, "spec_decode_metrics", None)
    if metrics is None:
        return None
    accepted = sum(j * count for j, count in enumerate(metrics.histogram))
    return PredictionCounts(drafted=int(metrics.num_draft_tokens), accepted=int(accepted))


def generation(output: Any) -> Generation:
    """One ``RequestOutput`` as a ``Generation``."""
    completions = tuple(
        CompletionDelta(index=c.index, text=c.text, token_ids=tuple(c.token_ids), finish_reason=c.finish_reason,
                        logprobs=_token_logprobs(c.token_ids, c.logprobs), prediction=_prediction_counts(c),
                        stop_reason=c.stop_reason if c.finish_reason is not None else None)
        for c in output.outputs)
    prompt = getattr(output, "prompt_logprobs", None)
    prompt_logprobs = None
    if prompt and output.prompt_token_ids is not None:
        prompt_logprobs = _token_logprobs(output.prompt_token_ids[1:], prompt[1:])
    return Generation(completions, bool(output.finished), output.num_cached_tokens, prompt_logprobs)


def export_positions(prompt: Sequence[int], output: Any, k: int) -> list[ExportPosition]:
    """The processed top-k distributions of every scored prompt position (position 0 has none)."""
    if output is None or output.prompt_logprobs is None:
        raise RuntimeError("the engine returned no prompt log-probabilities")
    return positions_from_prompt_logprobs(prompt, output.prompt_logprobs, k)


def top_logprobs(output: Any) -> list[tuple[int, float]]:
    """The first generated position's candidates, best first and id ascending among equals."""
    if output is None or not output.outputs or not output.outputs[0].logprobs:
        raise RuntimeError("engine returned no logprobs for a k-CBS row")
    ranked = sorted(output.outputs[0].logprobs[0].items(), key=lambda kv: (-kv[1].logprob, kv[0]))
    return [(token_id, lp.logprob) for token_id, lp in ranked]
