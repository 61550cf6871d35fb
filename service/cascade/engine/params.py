"""Cascade's ``GenerationRequest`` → vLLM ``SamplingParams``, and vLLM's exceptions → Cascade's.

The only gateway module that builds vLLM request objects. Marks that in-engine extensions read
(a prediction for the static-text proposer, an export for the prompt-logits hook) travel in
``SamplingParams.extra_args`` under keys ``cascade.vllm_compat.request_keys`` defines.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cascade.engine.types import EngineFailedError, EngineRequestError, GenerationRequest

if TYPE_CHECKING:
    from vllm import SamplingParams


def _class_names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def translate_error(exc: BaseException) -> Exception | None:
    """vLLM's request-validation error as ``EngineRequestError`` (the client's 400), its engine-died
    error as ``EngineFailedError``; ``None`` for anything else.

    vLLM raises ``VLLMValidationError`` (a ``VLLMClientError``, not a ``ValueError``) both when
    ``SamplingParams`` is built and when the engine admits a request (``bad_words`` that tokenise to
    nothing, a grammar it cannot compile). Its ``EngineGenerateError`` also wraps failures of one
    request, so only ``EngineDeadError`` proves the engine died. Matched by class name so the check
    also works on exceptions that crossed a process boundary."""
    names = _class_names(exc)
    if "VLLMClientError" in names:
        message = str(exc.args[0]) if exc.args else str(exc)
        param = getattr(exc, "parameter", None)
        return EngineRequestError(f"Invalid request: {message}", param if isinstance(param, str) else None,
                                  "invalid_value")
    if "EngineDeadError" in names:
        return EngineFailedError(str(exc))
    return None


def _extra_args(request: GenerationRequest) -> dict[str, Any] | None:
    from cascade.vllm_compat.request_keys import export_extra_args, prediction_extra_args

    if request.export_top_k is not None:
        return export_extra_args()
    if request.prediction is not None:
        p = request.prediction
        return prediction_extra_args(list(p.token_ids), p.mode, p.adaptive, p.scope)
    return None


def sampling_params(request: GenerationRequest, vocab_size: int) -> SamplingParams:
    """Build vLLM's parameters; raises ``EngineRequestError`` for what vLLM refuses."""
    from vllm import SamplingParams
    from vllm.sampling_params import RepetitionDetectionParams, RequestOutputKind, StructuredOutputsParams

    exporting = request.export_top_k is not None
    kwargs: dict[str, Any] = {
        "n": request.n,
        "max_tokens": 1 if exporting else request.max_tokens,
        "stop": list(request.stop),
        "stop_token_ids": list(request.stop_token_ids),
        "include_stop_str_in_output": request.include_stop_str_in_output,
        "seed": request.seed,
        "logprobs": None if request.logprob_token_ids else request.logprobs,
        "logprob_token_ids": list(request.logprob_token_ids) if request.logprob_token_ids else None,
        "logit_bias": request.logit_bias,
        "ignore_eos": request.ignore_eos or exporting,
        "min_tokens": 0 if exporting else request.min_tokens,
        "allowed_token_ids": None if request.allowed_token_ids is None else list(request.allowed_token_ids),
        "bad_words": None if request.bad_words is None else list(request.bad_words),
        "output_kind": RequestOutputKind.DELTA if request.stream else RequestOutputKind.FINAL_ONLY,
        "extra_args": _extra_args(request),
        "structured_outputs": None if (c := request.constraint) is None else StructuredOutputsParams(
            grammar=c.grammar, regex=c.regex, choice=None if c.choice is None else list(c.choice)),
        "skip_special_tokens": request.skip_special_tokens,
        "spaces_between_special_tokens": request.spaces_between_special_tokens,
        "prompt_logprobs": None if exporting else request.prompt_logprobs,
        "stream_interval": request.stream_interval,
        "repetition_detection": None if request.repetition is None else RepetitionDetectionParams(
            max_pattern_size=request.repetition[0], min_pattern_size=request.repetition[1],
            min_count=request.repetition[2]),
    }
    optional = {"temperature": request.temperature, "top_p": request.top_p, "top_k": request.top_k,
                "min_p": request.min_p, "presence_penalty": request.presence_penalty,
                "frequency_penalty": request.frequency_penalty,
                "repetition_penalty": request.repetition_penalty}
    kwargs.update({key: value for key, value in optional.items() if value is not None})
    if kwargs.get("top_k") == 0 or kwargs.get("top_k", 0) >= vocab_size:  # all tokens (bigints fail in the engine)
        kwargs["top_k"] = -1
    try:
        params = SamplingParams(**kwargs)
    except Exception as exc:
        error = translate_error(exc)
        if error is not None:
            raise error from None
        if isinstance(exc, (ValueError, TypeError)):
            raise EngineRequestError(f"Invalid sampling parameters: {exc}") from None
        raise
    if exporting:
        _export_fields(params, request.export_top_k or 0)
    return params


def _export_fields(params: SamplingParams, k: int) -> None:
    """Teacher-forced export: the prompt's processed top-k, one internal token never returned.

    Set after construction, so ``skip_reading_prefix_cache`` must be set too: a prefix-cache hit
    would leave the cached positions unscored. ``flat_logprobs`` keeps vLLM from building a dict of
    ``Logprob`` objects per position (k + 1 objects each) that the export only reads back."""
    params.prompt_logprobs = k
    params.flat_logprobs = True
    params.skip_reading_prefix_cache = True
    params.detokenize = False


def top_logprobs_params(k: int) -> SamplingParams:
    """One greedy step reporting the ``k`` best raw log-probabilities (k-CBS rows)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(max_tokens=1, temperature=0.0, logprobs=k, output_kind=RequestOutputKind.FINAL_ONLY)
