"""OpenAI request fields → the engine adapter's ``GenerationRequest``, enforcing the service's limits."""

from __future__ import annotations

from cascade.api.errors import APIError
from cascade.api.openai_protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from cascade.engine.types import Constraint, GenerationRequest, Prediction
from cascade.settings import Settings


def check_model(requested: str, settings: Settings) -> None:
    """404 for a model this service does not serve (OpenAI's ``model_not_found``)."""
    if requested not in (settings.model_name, settings.model):
        raise APIError(404, f"The model '{requested}' does not exist; this service serves "
                            f"'{settings.model_name}'", param="model", code="model_not_found")


def _stops(request: SamplingFields, settings: Settings) -> tuple[str, ...]:
    stops = request.stop_sequences()
    if len(stops) > settings.max_stop_sequences:
        raise APIError(400, f"At most {settings.max_stop_sequences} stop sequences are allowed",
                       param="stop")
    return stops


SEED_RANGE = (-(1 << 63), (1 << 64) - 1)


def _stop_token_ids(request: SamplingFields, settings: Settings, vocab_size: int) -> tuple[int, ...]:
    ids = request.stop_token_ids or []
    if len(ids) > settings.max_stop_token_ids:
        raise APIError(400, f"At most {settings.max_stop_token_ids} stop_token_ids are allowed",
                       param="stop_token_ids")
    return check_token_ids(ids, vocab_size, "stop_token_ids")


def _seed(request: SamplingFields) -> int | None:
    """The engine seeds a ``torch.Generator``, which takes 64 bits; outside that the engine
    request fails after admission (seen as a false "engine failed" 503), so refuse it here."""
    low, high = SEED_RANGE
    if request.seed is not None and not low <= request.seed <= high:
        raise APIError(400, f"seed must be in {low}..{high}", param="seed", code="invalid_value")
    return request.seed


def _logit_bias(request: SamplingFields, vocab_size: int) -> dict[int, float] | None:
    if not request.logit_bias:
        return None
    bias: dict[int, float] = {}
    for key, value in request.logit_bias.items():
        if not (key.isascii() and key.isdigit()):
            raise APIError(400, f"logit_bias keys must be token ids in ASCII digits, got '{key}'",
                           param="logit_bias", code="invalid_value")
        token = int(key)
        if not 0 <= token < vocab_size:
            raise APIError(400, f"logit_bias token id {token} is outside the vocabulary (0..{vocab_size - 1})",
                           param="logit_bias")
        bias[token] = value
    return bias


def _allowed_tokens(request: SamplingFields, vocab_size: int) -> tuple[int, ...] | None:
    if request.allowed_token_ids is None:
        return None
    return check_token_ids(request.allowed_token_ids, vocab_size, "allowed_token_ids")


def check_token_ids(ids: list[int], vocab_size: int, param: str, what: str | None = None) -> tuple[int, ...]:
    """Token ids a client sent, each checked against the vocabulary (the one place this is done)."""
    if any(not 0 <= t < vocab_size for t in ids):
        raise APIError(400, f"{what or param} must be in 0..{vocab_size - 1}", param=param)
    return tuple(ids)


def resolve_max_tokens(requested: int | None, prompt_len: int, settings: Settings, param: str,
                       prompt_param: str = "prompt") -> int:
    """The completion budget: what was asked for, bounded by the context window and the limit. A
    prompt that fills the window alone is the prompt's fault (``prompt_param``), whatever was asked."""
    room = settings.max_model_len - prompt_len
    if room <= 0:
        raise APIError(400, f"This model's maximum context length is {settings.max_model_len} tokens; the "
                            f"prompt alone has {prompt_len} tokens, leaving no room for a completion. Shorten "
                            "the prompt.", param=prompt_param, code="context_length_exceeded")
    if requested is not None and requested > room:
        raise APIError(400, f"This model's maximum context length is {settings.max_model_len} tokens; the "
                            f"prompt has {prompt_len} tokens plus {requested} completion tokens. Shorten the "
                            f"prompt or lower {param}.",
                       param=param, code="context_length_exceeded")
    if requested is not None and requested > settings.max_tokens_limit:
        raise APIError(400, f"{param} may be at most {settings.max_tokens_limit}", param=param)
    return requested if requested is not None else min(room, settings.max_tokens_limit)


def check_scored_prompts(prompts: list[list[int]], settings: Settings) -> None:
    """Scoring a prompt (``echo`` with ``max_tokens`` 0) generates nothing, but vLLM takes log-probabilities
    of a prompt only while it runs one token past it, so a scored prompt holds at most
    ``max_model_len − 1`` tokens (a rolling-window evaluation sets its window so)."""
    longest = max(len(p) for p in prompts)
    if longest >= settings.max_model_len:
        raise APIError(400, f"This model's maximum context length is {settings.max_model_len} tokens and scoring "
                            f"a prompt (echo, max_tokens 0) needs one position past it, so a scored prompt holds at "
                            f"most {settings.max_model_len - 1} tokens; this one has {longest}. Shorten the prompt.",
                       param="prompt", code="context_length_exceeded")


def check_min_tokens(min_tokens: int, max_tokens: int) -> None:
    """``max_tokens`` is the request's own (0 when echo only scores the prompt), not what the engine is
    asked for."""
    if min_tokens > max_tokens:
        raise APIError(400, f"min_tokens ({min_tokens}) may not exceed max_tokens ({max_tokens})",
                       param="min_tokens", code="invalid_value")


def generation_request(request: SamplingFields, *, max_tokens: int, logprobs: int | None, settings: Settings,
                       vocab_size: int, stream: bool, prediction: Prediction | None = None,
                       constraint: Constraint | None = None, prompt_logprobs: int | None = None
                       ) -> GenerationRequest:
    """What to ask the engine for; every range the models check was checked already, these are the
    rules that need the request as a whole or the service's limits."""
    if request.n > settings.max_n:
        raise APIError(400, f"n may be at most {settings.max_n}", param="n")
    if request.n > 1 and request.temperature == 0:
        raise APIError(400, "n > 1 needs temperature > 0: greedy decoding gives n identical choices",
                       param="n", code="invalid_value")
    check_min_tokens(request.min_tokens, max_tokens)
    if any(not word.lstrip() for word in request.bad_words or []):
        raise APIError(400, "bad_words entries must contain a non-whitespace character", param="bad_words",
                       code="invalid_value")
    if request.prompt_logprobs is not None:
        if request.stream:
            raise APIError(400, "prompt_logprobs are not available when stream is true", param="prompt_logprobs")
        if request.prompt_logprobs > settings.max_top_logprobs:
            raise APIError(400, f"prompt_logprobs may be at most {settings.max_top_logprobs}", param="prompt_logprobs")
    if request.logprob_token_ids is not None and logprobs is None:
        needed = "logprobs: true" if isinstance(request, ChatCompletionRequest) else "logprobs"
        raise APIError(400, f"logprob_token_ids needs {needed}: they are shown as each token's top_logprobs",
                       param="logprob_token_ids")
    if logprobs is not None and logprobs > settings.max_top_logprobs:
        field = "top_logprobs" if isinstance(request, ChatCompletionRequest) else "logprobs"
        raise APIError(400, f"{field} may be at most {settings.max_top_logprobs}", param=field)
    return GenerationRequest(
        max_tokens=max_tokens, n=request.n, stream=stream, stop=_stops(request, settings),
        stop_token_ids=_stop_token_ids(request, settings, vocab_size),
        include_stop_str_in_output=request.include_stop_str_in_output, seed=_seed(request),
        logprobs=logprobs, logit_bias=_logit_bias(request, vocab_size), ignore_eos=request.ignore_eos,
        min_tokens=request.min_tokens, allowed_token_ids=_allowed_tokens(request, vocab_size),
        bad_words=None if request.bad_words is None else tuple(request.bad_words),
        temperature=request.temperature, top_p=request.top_p, top_k=request.top_k, min_p=request.min_p,
        presence_penalty=request.presence_penalty, frequency_penalty=request.frequency_penalty,
        repetition_penalty=request.repetition_penalty, constraint=constraint,
        skip_special_tokens=request.skip_special_tokens,
        spaces_between_special_tokens=request.spaces_between_special_tokens, prediction=prediction,
        prompt_logprobs=prompt_logprobs, cache_salt=request.cache_salt, stream_interval=request.stream_interval,
        repetition=None if (r := request.repetition_detection) is None or r.max_pattern_size == 0
        else (r.max_pattern_size, r.min_pattern_size, r.min_count),
        logprob_token_ids=None if request.logprob_token_ids is None
        else check_token_ids(request.logprob_token_ids, vocab_size, "logprob_token_ids"))


def shown_alternatives(request: SamplingFields, top_n: int | None) -> int | None:
    """Alternatives a reply shows per generated token: the ``top_n`` asked for, or with vLLM's
    ``logprob_token_ids`` every one of those tokens (and the sampled one), as vLLM shows them."""
    if top_n is None or request.logprob_token_ids is None:
        return top_n
    return len(request.logprob_token_ids) + 1


def unsupported_fields(request: CompletionRequest | ChatCompletionRequest) -> None:
    """Fields OpenAI defines that this service does not implement get a clear 400, not silence."""
    if isinstance(request, CompletionRequest):
        if request.suffix:
            raise APIError(400, "suffix is not supported", param="suffix")
        if request.best_of not in (None, request.n):
            raise APIError(400, "best_of is not supported", param="best_of")
        if request.echo and (request.codec is not None or request.compression):
            raise APIError(400, "echo cannot be combined with " + ("codec" if request.codec else "compression"),
                           param="echo")
    else:
        if request.tools and request.tool_choice != "none":
            raise APIError(400, "tools are not supported by this model; send tool_choice 'none' to pass tools "
                                "without calling them", param="tools")
        if request.tool_choice not in (None, "none"):
            raise APIError(400, "tool_choice needs tools, which this model does not support", param="tool_choice")
        for field in ("reasoning_effort", "verbosity"):
            if getattr(request, field) is not None:
                raise APIError(400, f"{field} is not supported by this model: it has no reasoning or "
                                    "verbosity setting", param=field, code="unsupported_parameter")
    if request.priority != 0:
        raise APIError(400, f"priority {request.priority} needs priority scheduling, which this service does not "
                            "run (requests are served first come, first served): send 0 or leave it out",
                       param="priority", code="unsupported_parameter")
    if request.length_penalty != 1.0 and not request.use_beam_search:
        raise APIError(400, "length_penalty applies to use_beam_search only", param="length_penalty")
    if request.stream_options and not request.stream:
        raise APIError(400, "stream_options is only allowed with stream=true", param="stream_options")
