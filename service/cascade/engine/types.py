"""Cascade's own request and output types at the engine boundary.

Routes build a ``GenerationRequest`` and read ``Generation``/``CompletionDelta`` objects; only the
adapter (``cascade.engine.params`` and ``cascade.engine.outputs``) knows how they map onto vLLM's
``SamplingParams`` and ``RequestOutput``. Nothing here imports vLLM or torch.
"""

from __future__ import annotations

from dataclasses import dataclass


class EngineRequestError(ValueError):
    """The engine refused a request as invalid (vLLM's validation errors): the client's 400."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class EngineFailedError(RuntimeError):
    """The engine died while serving a request; only this may tell clients the service is restarting."""


@dataclass(frozen=True)
class Prediction:
    """A static-text prediction the predict engine's proposer drafts from (token ids of the text)."""

    token_ids: tuple[int, ...]
    mode: str = "smart"
    adaptive: bool = True
    scope: str = ""  # whose earlier responses it may draft from (``ResponseCache``): the request's ``user``


@dataclass(frozen=True)
class Constraint:
    """What sampled text must match: one of a grammar (EBNF), a regular expression or a choice of strings."""

    grammar: str | None = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    source: str = ""
    """The request field it came from (``response_format``, ``structured_outputs``), named by errors."""


@dataclass(frozen=True)
class GenerationRequest:
    """What to sample, in Cascade's terms; ranges were checked by the API models already."""

    max_tokens: int
    n: int = 1
    stream: bool = False
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    seed: int | None = None
    logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    allowed_token_ids: tuple[int, ...] | None = None
    bad_words: tuple[str, ...] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    constraint: Constraint | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    prediction: Prediction | None = None
    export_top_k: int | None = None
    prompt_logprobs: int | None = None
    """The prompt's own log-probabilities with this many alternatives (a completion's ``echo``)."""
    cache_salt: str | None = None
    """vLLM's: the prompt shares prefix-cache blocks only with prompts of the same salt."""
    repetition: tuple[int, int, int] | None = None
    """vLLM's repetition detection: (max pattern size, min pattern size, min count)."""
    stream_interval: int | None = None
    """vLLM's: a stream's outputs every this-many tokens."""
    logprob_token_ids: tuple[int, ...] | None = None
    """vLLM's: at each position, the log-probabilities of these tokens (and the sampled one) instead of the top-n."""


@dataclass(frozen=True)
class Candidate:
    """One entry of a position's top log-probabilities."""

    token_id: int
    token: str
    logprob: float
    rank: int | None = None
    """Its rank in the whole vocabulary (1: the most likely), as the engine reports it."""


@dataclass(frozen=True)
class TokenLogprobs:
    """The sampled token and the engine's ranked candidates at its position (best first; the
    sampled token is among them, also when it is outside the requested top-n)."""

    token_id: int
    token: str
    logprob: float
    candidates: tuple[Candidate, ...]
    rank: int | None = None


@dataclass(frozen=True)
class PredictionCounts:
    """Draft tokens the proposer offered and how many of them the engine accepted."""

    drafted: int = 0
    accepted: int = 0


@dataclass(frozen=True)
class CompletionDelta:
    """New output of one sequence since the last ``Generation`` (or all of it, when not streaming)."""

    index: int
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None
    logprobs: tuple[TokenLogprobs, ...] | None = None
    prediction: PredictionCounts | None = None
    stop_reason: int | str | None = None
    """The stop sequence or stop token id that finished it (``None``: an end-of-sequence token, or length)."""


@dataclass(frozen=True)
class Generation:
    """One engine output for one prompt."""

    completions: tuple[CompletionDelta, ...]
    finished: bool
    cached_tokens: int | None = None
    prompt_logprobs: tuple[TokenLogprobs, ...] | None = None
    """Positions 1… of the prompt (position 0 has nothing to be predicted from), when asked for."""
