"""OpenAI ``prediction`` → predicted token ids for the predict engine; usage accounting."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from cascade.api.errors import APIError
from cascade.api.input_bounds import check_fits, tokenize
from cascade.api.openai_protocol import ChatCompletionRequest, CompletionRequest
from cascade.api.sampling import check_token_ids
from cascade.engine.manager import EngineManager
from cascade.engine.types import Prediction, PredictionCounts
from cascade.settings import Settings


@dataclass
class PredictionUsage:
    """Accepted/rejected prediction tokens summed over a request's sequences (OpenAI's definition:
    accepted = predicted tokens that appear in the completion, rejected = predicted tokens proposed to
    the model but not used; both count only what the proposer actually drafted)."""

    accepted: int = 0
    rejected: int = 0

    def add(self, counts: PredictionCounts | None) -> None:
        if counts is None:
            return
        self.accepted += counts.accepted
        self.rejected += max(0, counts.drafted - counts.accepted)

    def details(self) -> dict[str, int]:
        return {"reasoning_tokens": 0, "accepted_prediction_tokens": self.accepted,
                "rejected_prediction_tokens": self.rejected}


async def predicted(body: ChatCompletionRequest | CompletionRequest, engines: EngineManager,
                    settings: Settings) -> Prediction | None:
    """Validate ``prediction`` and return it as token ids, or None without one (or with an empty one)."""
    prediction = body.prediction
    if prediction is None:
        return None
    from cascade.predict.static_text import normalise_newlines

    if not settings.enable_predictions:
        raise APIError(400, "Predicted outputs are disabled on this server", param="prediction")
    if body.n != 1:
        raise APIError(400, "prediction is not supported with n > 1", param="n")
    if (isinstance(body, ChatCompletionRequest) and body.logprobs) or (
            isinstance(body, CompletionRequest) and body.logprobs is not None):
        raise APIError(400, "prediction is not supported together with logprobs", param="logprobs")
    # vLLM's speculative decoding, which serves predictions, cannot apply these (its own refusal names neither)
    if body.logit_bias:
        raise APIError(400, "prediction is not supported together with logit_bias", param="logit_bias",
                       code="unsupported_parameter")
    if body.min_p and body.temperature != 0:
        raise APIError(400, "prediction is not supported together with min_p above 0 when sampling", param="min_p",
                       code="unsupported_parameter")
    text = prediction.text()
    if (text is None) == (prediction.token_ids is None):
        raise APIError(400, "prediction needs exactly one of 'content' or 'token_ids'", param="prediction")
    if prediction.token_ids is not None:
        ids = list(check_token_ids(prediction.token_ids, len(engines.tokenizer), "prediction.token_ids"))
    else:
        assert text is not None
        check_fits(len(text), settings.max_prediction_tokens, engines.tokenizer, "prediction",
                   "a prediction (max_prediction_tokens)")
        ids = await tokenize(engines.tokenizer, normalise_newlines(text))
    if not ids:  # the prediction of a file still empty: nothing to draft, served as without one
        return None
    if len(ids) > settings.max_prediction_tokens:
        raise APIError(400, f"prediction is longer than {settings.max_prediction_tokens} tokens "
                            f"({len(ids)})", param="prediction")
    return Prediction(tuple(ids), body.prediction_mode, scope=response_scope(body.user))


def response_scope(user: str | None) -> str:
    """The response-cache scope of a request: its OpenAI ``user`` as a digest (any length of id costs
    the engine 16 bytes), or the anonymous scope."""
    if not user:
        return ""
    return hashlib.sha256(user.encode("utf-8", "surrogatepass")).hexdigest()[:16]
