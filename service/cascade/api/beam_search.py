"""vLLM's ``use_beam_search`` on completions and chat: ``n`` beams searched with ``kcbs.BeamSearch``
through the same engine queries as k-CBS, answered as ``n`` choices, best first."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Sequence

from fastapi import Request
from fastapi.responses import JSONResponse

from cascade.api.completion_render import Choice, Kind, choice_body, envelope, render_logprobs, usage
from cascade.api.deps import reply_id, request_id
from cascade.api.errors import APIError
from cascade.api.openai_protocol import ChatCompletionRequest, CompletionRequest
from cascade.api.sampling import resolve_max_tokens
from cascade.api.streaming import until_disconnect
from cascade.engine.types import Candidate, CompletionDelta, TokenLogprobs
from cascade.export.token_table import TokenTable
from cascade.kcbs.algorithm import MAX_BEAM_WIDTH
from cascade.kcbs.beam_search import Beam, BeamSearch
from cascade.kcbs.driver import run_search
from cascade.lifecycle import Gateway
from cascade.settings import Settings

_IGNORED = "temperature, top_p, top_k, min_p, seed"
"""Accepted and without effect, as in vLLM: the search ranks by the model's own log-probabilities."""


def _refused(body: CompletionRequest | ChatCompletionRequest) -> str | None:
    """The first field set to a value that would change the answer and that a beam search does not
    honour (vLLM drops them silently); neutral values (an empty list, a penalty of no effect) pass."""
    changed = {
        "stream": body.stream, "stop": bool(body.stop_sequences()), "stop_token_ids": bool(body.stop_token_ids),
        "logit_bias": bool(body.logit_bias), "allowed_token_ids": body.allowed_token_ids is not None,
        "bad_words": bool(body.bad_words), "min_tokens": body.min_tokens > 0,
        "presence_penalty": body.presence_penalty not in (None, 0.0),
        "frequency_penalty": body.frequency_penalty not in (None, 0.0),
        "repetition_penalty": body.repetition_penalty not in (None, 1.0),
        "structured_outputs": body.structured_outputs is not None,
        "response_format": body.response_format is not None and body.response_format.type != "text",
        "prediction": body.prediction is not None, "prompt_logprobs": body.prompt_logprobs is not None,
        "logprob_token_ids": body.logprob_token_ids is not None,
        "repetition_detection": (r := body.repetition_detection) is not None and r.max_pattern_size > 0,
    }
    if isinstance(body, CompletionRequest):
        changed |= {"codec": body.codec is not None, "compression": body.compression}
    return next((name for name, value in changed.items() if value), None)


def check_beam_search(body: CompletionRequest | ChatCompletionRequest, echo_logprobs: bool, top_n: int | None,
                      settings: Settings) -> None:
    """400s for what a beam search cannot take, before any work is done."""
    if (field := _refused(body)) is not None:
        verb = "stream" if field == "stream" else f"take {field}"
        raise APIError(400, f"use_beam_search cannot {verb}: the search ranks whole sequences by the model's "
                            f"own log-probabilities ({_IGNORED} have no effect on it)", param=field)
    if echo_logprobs:
        raise APIError(400, "use_beam_search cannot take logprobs with echo: the prompt is not scored",
                       param="logprobs")
    widest = min(settings.max_n, MAX_BEAM_WIDTH)
    if body.n > widest:
        raise APIError(400, f"n (the beam width) may be at most {widest}", param="n")
    if top_n is not None and top_n > settings.max_top_logprobs:
        field = "top_logprobs" if isinstance(body, ChatCompletionRequest) else "logprobs"
        raise APIError(400, f"{field} may be at most {settings.max_top_logprobs}", param=field)


def _budget(body: CompletionRequest | ChatCompletionRequest, prompt_len: int, gateway: Gateway) -> int:
    """The steps of a search: ``max_tokens`` as asked, or as much as the k-CBS limits allow (each step
    evaluates ``n`` rows)."""
    settings = gateway.settings
    param, requested = body.asked_tokens()
    tokens = resolve_max_tokens(requested, prompt_len, settings, param,
                                prompt_param="messages" if isinstance(body, ChatCompletionRequest) else "prompt")
    if tokens == 0:
        raise APIError(400, f"{param} must be at least 1 with use_beam_search", param=param)
    limit = min(settings.max_kcbs_steps, settings.max_kcbs_rows // body.n)
    if requested is None:
        return min(tokens, limit)
    if tokens > limit:
        raise APIError(400, f"{param} may be at most {limit} with use_beam_search and n = {body.n} (max_kcbs_steps, "
                            f"and n × {param} at most max_kcbs_rows: the engine evaluates that many rows)",
                       param=param)
    return tokens


def _delta(index: int, beam: Beam, text: str, top_n: int | None, table: TokenTable | None) -> CompletionDelta:
    """A beam as the renderer takes a finished sequence, with each position's row as its log-probabilities.
    An end token stays in the token ids, as sampling keeps it, and its ``stop_reason`` is null, as for a
    sampled end (vLLM's beam search names the id)."""
    ids = (*beam.token_ids, *((beam.end_token,) if beam.end_token is not None else ()))
    logprobs = None
    if top_n is not None and table is not None:
        positions = []
        for token, row in zip(ids, beam.steps, strict=True):
            candidates = tuple(Candidate(t, table.string(t), lp, rank) for rank, (t, lp) in enumerate(row, 1))
            chosen = next(c for c in candidates if c.token_id == token)
            positions.append(TokenLogprobs(token, chosen.token, chosen.logprob, candidates, chosen.rank))
        logprobs = tuple(positions)
    return CompletionDelta(index, text, ids, beam.finish_reason, logprobs)


async def _search(gateway: Gateway, prompt: list[int], search: BeamSearch, k: int, rid: str,
                  cache_salt: str | None) -> list[Beam]:
    top_logprobs = functools.partial(gateway.engines.top_logprobs, cache_salt=cache_salt)
    async for _ in run_search(top_logprobs, prompt, search, k, None, 1.0, rid, gateway.live_searches):
        gateway.metrics.kcbs_steps.inc()
    return search.result()


async def beam_search_reply(request: Request, body: CompletionRequest | ChatCompletionRequest, kind: Kind,
                            prompts: Sequence[list[int]], echo: Sequence[str] | None, gateway: Gateway,
                            top_n: int | None) -> JSONResponse:
    """Search every prompt (concurrently: the engine batches their rows) and answer with ``n`` choices
    per prompt, best first; ``echo`` texts go before each prompt's choices."""
    settings, engines, metrics = gateway.settings, gateway.engines, gateway.metrics
    check_beam_search(body, echo is not None and top_n is not None, top_n, settings)
    steps = [_budget(body, len(p), gateway) for p in prompts]
    searches = [BeamSearch(body.n, s, len(p), engines.eos_token_ids, ignore_eos=body.ignore_eos,
                           length_penalty=body.length_penalty) for p, s in zip(prompts, steps, strict=True)]
    k = max(searches[0].candidates_per_row, top_n or 0)  # every search of a request has the same width
    rid = request_id(request)
    created = int(time.time())
    metrics.prompt_tokens.labels(kind).inc(sum(len(p) for p in prompts))

    async def run() -> list[list[Beam]]:
        return list(await asyncio.gather(*(_search(gateway, p, s, k, f"{rid}-{i}", body.cache_salt)
                                           for i, (p, s) in enumerate(zip(prompts, searches, strict=True)))))

    results = await until_disconnect(request, run)
    table = gateway.token_table() if top_n is not None else None
    body_out = envelope(kind, reply_id(request), settings.model_name, chunk=False, created=created)
    choices = []
    completion_tokens = 0

    def decode(beams: list[Beam]) -> list[str]:
        return [str(engines.tokenizer.decode(list(b.token_ids), skip_special_tokens=body.skip_special_tokens))
                for b in beams]

    for p, beams in enumerate(results):
        texts = await asyncio.to_thread(decode, beams)
        for i, (beam, text) in enumerate(zip(beams, texts, strict=True)):
            index = p * body.n + i
            choice = Choice(text=echo[p]) if echo is not None else Choice()
            choice.add(_delta(i, beam, text, top_n, table), top_n, kind, table, body.return_tokens_as_token_ids)
            completion_tokens += choice.tokens
            logprobs = render_logprobs(kind, choice.logprobs, 0, choice.characters) if top_n is not None else None
            rendered = choice_body(kind, index, choice.text, logprobs, choice.finish_reason, chunk=False,
                                   stop_reason=choice.stop_reason)
            rendered["token_ids"] = choice.token_ids if body.return_token_ids else None
            if kind == "completion":
                rendered |= {"prompt_token_ids": prompts[p] if body.return_token_ids else None,
                             "prompt_logprobs": None}
            choices.append(rendered)
    body_out["choices"] = choices
    if kind == "chat":
        body_out |= {"prompt_token_ids": prompts[0] if body.return_token_ids else None, "prompt_logprobs": None}
        if getattr(body, "return_prompt_text", False):
            body_out["prompt_text"] = await asyncio.to_thread(engines.tokenizer.decode, prompts[0])
    metrics.completion_tokens.labels(kind).inc(completion_tokens)
    body_out["usage"] = usage(sum(len(p) for p in prompts), completion_tokens)
    return JSONResponse(body_out)
