"""Request models of the OpenAI surface. Unknown fields are rejected, ranges are OpenAI's."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


def _unencodable(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def lone_surrogate_path(value: object) -> tuple[str | int, ...] | None:
    """Where in ``value`` a string holds a lone UTF-16 surrogate: valid JSON (``"\\ud800"``) that no
    tokenizer, engine or UTF-8 reply can encode. ``None`` when there is none; ``()`` for ``value``
    itself; a key holding one is named by its dictionary's path (the key itself cannot be echoed).
    Iterative: nesting depth costs no recursion."""
    stack: list[tuple[tuple[str | int, ...], object]] = [((), value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if _unencodable(item):
                return path
        elif isinstance(item, dict):
            if any(isinstance(key, str) and _unencodable(key) for key in item):
                return path
            stack.extend(((*path, str(key)), child) for key, child in reversed(item.items()))
        elif isinstance(item, list | tuple):
            stack.extend(((*path, index), child) for index, child in reversed(list(enumerate(item))))
    return None


class LoneSurrogateError(ValueError):
    """A field's value holds a lone surrogate at ``path`` (below the field): the error handler
    appends it to the field's location, so the 400 names the exact string."""

    def __init__(self, path: tuple[str | int, ...]) -> None:
        super().__init__("text must be valid Unicode: a lone surrogate such as \\ud800 cannot be encoded")
        self.path = path


class StrictModel(BaseModel):
    """Rejects unknown fields (a typo must not silently change what the user asked for), values of
    the wrong JSON type (``"5"``, ``true`` or ``1e2`` for an integer, ``"yes"`` for a boolean: a 400
    as OpenAI answers, not a guess; an integer still reads as a number) and text that is not valid
    Unicode (a 400 naming the field, not a 500 deep in the tokenizer). ``NaN`` and ``Infinity``, which
    Python's JSON reader accepts, are not numbers a parameter can take: "must be a finite number"."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: object) -> object:
        """OpenAI documents its optional parameters as "… or null", and a client that sends ``None``
        means "the default": ``"n": null`` is ``n`` 1 and a completion's ``"max_tokens": null`` is 16,
        as if the key were absent. A required field stays required."""
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {k: v for k, v in data.items() if v is not None or k not in fields or fields[k].is_required()}

    @field_validator("*", mode="before")
    @classmethod
    def _valid_unicode(cls, value: object) -> object:
        path = lone_surrogate_path(value)
        if path is not None:
            raise LoneSurrogateError(path)
        return value


Metadata = Annotated[dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
                     Field(max_length=16)]
"""OpenAI's ``metadata``: at most 16 pairs, keys of at most 64 characters and values of at most 512."""


class StreamOptions(StrictModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False
    include_obfuscation: bool | None = None
    """OpenAI pads chunks with an ``obfuscation`` field against length side channels; this service adds
    none, so either value streams the same chunks (the SDK sends the field when a caller sets it)."""


class StructuredOutputs(StrictModel):
    """vLLM's ``structured_outputs`` extension: exactly one constraint on what may be sampled."""

    json_: Annotated[dict[str, Any] | str | None, Field(alias="json")] = None
    regex: Annotated[str, Field(min_length=1)] | None = None
    choice: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] | None = None
    grammar: Annotated[str, Field(min_length=1)] | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool | None = None
    """For ``json``/``json_object``: false allows whitespace between JSON tokens (vLLM's default); unset
    or true writes compact JSON, this service's default (a small model pads free whitespace until
    ``max_tokens``)."""
    disable_additional_properties: bool | None = None
    """For ``json``: false lets objects carry properties the schema does not name; unset or true does not."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputs:
        given = [name for name in ("json", "regex", "choice", "grammar", "json_object")
                 if getattr(self, "json_" if name == "json" else name) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of json, regex, choice, grammar or json_object"
                             + (f", not {' and '.join(given)}" if given else ""))
        if self.json_object is False:
            raise ValueError("json_object must be true when given")
        return self


class RepetitionDetection(StrictModel):
    """vLLM's ``repetition_detection``: the engine ends a sequence (finish reason ``repetition``) once its
    last ``n`` tokens, for a pattern size ``n`` in ``min_pattern_size…max_pattern_size``, repeat
    ``min_count`` times in a row."""

    max_pattern_size: Annotated[int, Field(ge=0, le=256)] = 0
    min_pattern_size: Annotated[int, Field(ge=0, le=256)] = 0
    min_count: Annotated[int, Field(ge=0, le=1 << 20)] = 0

    @model_validator(mode="after")
    def _consistent(self) -> RepetitionDetection:
        if self.min_pattern_size > self.max_pattern_size:
            raise ValueError("min_pattern_size may not exceed max_pattern_size")
        if self.max_pattern_size > 0 and self.min_count < 2:
            raise ValueError("min_count must be at least 2 (a pattern seen once is no repetition)")
        return self


class JsonSchema(StrictModel):
    """OpenAI's ``response_format.json_schema``: a named schema, ``strict`` or not."""

    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: str | None = None
    schema_: Annotated[dict[str, Any], Field(alias="schema")] = Field(default_factory=dict)
    strict: bool | None = None

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class ResponseFormat(StrictModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None


class SamplingFields(StrictModel):
    """Sampling parameters shared by completions and chat completions (OpenAI's, and vLLM's extensions
    that change only what is sampled or how its text is rendered)."""

    model: str
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    n: Annotated[int, Field(ge=1)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=10.0)] | None = None
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    min_tokens: Annotated[int, Field(ge=0)] = 0
    allowed_token_ids: Annotated[list[int], Field(min_length=1)] | None = None
    bad_words: list[str] | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: Annotated[int, Field(ge=-1)] | None = None
    """Keep only this many of the prompt's tokens (vLLM's; −1: as many as leave room for one more)."""
    truncation_side: Literal["left", "right"] | None = None
    """Which end ``truncate_prompt_tokens`` cuts (vLLM's): ``left`` (the default) keeps the last tokens."""
    prompt_logprobs: Annotated[int, Field(ge=0)] | None = None
    """Each prompt token's log-probability and this many alternatives (vLLM's; not streamed)."""
    return_token_ids: bool = False
    """The prompt's and each choice's token ids beside the text (vLLM's)."""
    return_tokens_as_token_ids: bool = False
    """Log-probabilities name each token ``token_id:<id>`` (vLLM's), for tokens that are not text alone."""
    repetition_detection: RepetitionDetection | None = None
    stream_interval: Annotated[int, Field(ge=1, le=1 << 20)] | None = None
    """vLLM's: a stream sends its text every this-many tokens (fewer, larger chunks)."""
    logprob_token_ids: Annotated[list[int], Field(min_length=1, max_length=128)] | None = None
    """vLLM's: the log-probabilities of these tokens at every generated position (needs logprobs)."""
    use_beam_search: bool = False
    """vLLM's: ``n`` beams searched by the model's log-probabilities instead of sampling (``beam_search``)."""
    length_penalty: Annotated[float, Field(ge=-10.0, le=10.0)] = 1.0
    """vLLM's: a beam's score is its log-probability over its length to this power (with use_beam_search)."""
    priority: int = 0
    """vLLM's: only 0 is served (the engine schedules first come, first served)."""
    request_id: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")] | None = None
    """vLLM's: the reply's id is ``cmpl-<request_id>`` (``chatcmpl-`` for chat); engine ids stay the server's."""
    session_id: str | None = None
    """vLLM's routing hint for related requests; one engine here, so it routes nothing."""
    cache_salt: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^@/\\\x00]+$")] | None = None
    """vLLM's: prompts share prefix-cache blocks only with requests of the same salt."""

    def stop_sequences(self) -> tuple[str, ...]:
        """``stop`` as a tuple of strings (OpenAI takes one string or a list)."""
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    @field_validator("stop")
    @classmethod
    def _stop_non_empty(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else (value or [])
        if any(s == "" for s in stops):
            raise ValueError("stop sequences must be non-empty strings")
        return value


class Prediction(StrictModel):
    """OpenAI's predicted output; ``token_ids`` is Cascade's extension for pre-tokenised clients."""

    type: Literal["content"]
    content: str | list[TextPart] | None = None
    token_ids: list[int] | None = None

    def text(self) -> str | None:
        if self.content is None:
            return None
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class PredictionFields(StrictModel):
    prediction: Prediction | None = None
    prediction_mode: Literal["smart", "prefix"] = "smart"


_SHA256_HEX = r"^[0-9a-f]{64}$"


class CodecCheck(StrictModel):
    """What an encode-mode object was made from (docs/codec-format.md, "Replay objects"): decode mode
    verifies it, so a replay under another model, numerics or prompt, or from damaged data, is an error."""

    version: Literal[1]
    model: Annotated[str, Field(pattern=_SHA256_HEX)]
    numerics: Annotated[str, Field(max_length=64)]
    prompt_sha256: Annotated[str, Field(pattern=_SHA256_HEX)]
    tokens_sha256: Annotated[str, Field(pattern=_SHA256_HEX)]


class CodecField(StrictModel):
    """Cascade extension on /v1/completions: code the sampled tokens, or replay them from a code."""

    mode: Literal["encode", "decode"]
    precision_bits: Literal[16, 24, 32] = 32
    top_k: Annotated[int, Field(ge=1, le=1024)] = 64
    data: str | None = None
    tokens: Annotated[int, Field(ge=1)] | None = None
    token_ids: Annotated[list[int], Field(min_length=1)] | None = None
    numerics: Annotated[str, Field(max_length=64)] | None = None
    check: CodecCheck | None = None


class CompletionRequest(SamplingFields, PredictionFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    add_special_tokens: bool | None = None
    """vLLM's: what the tokenizer adds to a text prompt (a BOS, for models that take one). Unset, it is
    true as in vLLM, except on a codec request, which tokenises as releases before it did (false)."""
    max_tokens: Annotated[int, Field(ge=0)] | None = 16
    logprobs: Annotated[int, Field(ge=0)] | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: Annotated[int, Field(ge=1)] | None = None
    codec: CodecField | None = None
    compression: bool = False
    compression_top_k: int = 100

    def asked_tokens(self) -> tuple[str, int | None]:
        """The field naming the completion budget, and the budget it asks for (``None``: the default)."""
        return "max_tokens", self.max_tokens


class TextPart(StrictModel):
    type: Literal["text"]
    text: str


class RefusalPart(StrictModel):
    """An earlier assistant turn's refusal, as OpenAI returns it in content parts: its words are what the
    assistant said, so the chat template reads them as text."""

    type: Literal["refusal"]
    refusal: str


class MediaPart(BaseModel):
    """An OpenAI image/audio/file content part: parsed only so it can be refused by name (this
    model reads text), instead of failing as "not a valid string"."""

    model_config = ConfigDict(extra="allow")
    type: Literal["image_url", "input_image", "input_audio", "file"]


class ToolCallFunction(StrictModel):
    name: str
    arguments: str


class ToolCall(StrictModel):
    """A tool call an earlier assistant turn made (replayed history: this model never makes one)."""

    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(StrictModel):
    """A message as OpenAI's chat API takes it, and as the SDK sends back an earlier reply
    (``message.model_dump()`` holds ``annotations``, ``audio`` and ``function_call``, null or empty):
    ``annotations`` (citations of a reply) are accepted and do not reach the template; an ``audio``
    reply or a deprecated ``function_call`` is refused by name (``prompts``). vLLM's ``reasoning``
    is null in this service's own replies."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart | RefusalPart | MediaPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None
    annotations: list[dict[str, Any]] | None = None
    audio: dict[str, Any] | None = None
    function_call: dict[str, Any] | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None
    """An earlier assistant turn's reasoning, as vLLM's reasoning parsers return it (either name):
    it reaches the chat template as ``reasoning_content``, which templates of thinking models read."""

    def media(self) -> str | None:
        """The type of the first non-text content part, if any."""
        if isinstance(self.content, list):
            return next((part.type for part in self.content if isinstance(part, MediaPart)), None)
        return None

    def text(self) -> str:
        """The message content as one string (text parts joined)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text if isinstance(part, TextPart) else part.refusal
                       for part in self.content if isinstance(part, TextPart | RefusalPart))


class ChatCompletionRequest(SamplingFields, PredictionFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0)] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    add_special_tokens: bool = False
    """vLLM's: special tokens the tokenizer adds on top of what the chat template writes."""
    echo: bool = False
    """vLLM's: a last assistant message is put before the reply's content (with continue_final_message)."""
    tools: list[dict[str, object]] | None = None
    tool_choice: str | dict[str, object] | None = None
    parallel_tool_calls: bool | None = None
    # Accepted and without effect on the result (bookkeeping on OpenAI's side; the text modality).
    store: bool | None = None
    metadata: Metadata | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    modalities: list[Literal["text"]] | None = None
    return_prompt_text: bool = False
    """vLLM's: the prompt the chat template rendered, as ``prompt_text`` (a stream's first chunk)."""
    include_reasoning: bool = True
    thinking_token_budget: Annotated[int, Field(ge=-1)] | None = None
    """vLLM's reasoning switches: they act on a thinking section, which this service's models do not write
    (as in vLLM without a reasoning parser, they change nothing)."""
    # Parsed only to be refused by name: they would change the result and this model has no such knob.
    reasoning_effort: str | None = None
    verbosity: str | None = None

    def asked_tokens(self) -> tuple[str, int | None]:
        """The field naming the completion budget (``max_completion_tokens``, OpenAI's newer name, wins over
        ``max_tokens``), and the budget it asks for (``None``: as much as the context leaves)."""
        if self.max_completion_tokens is not None:
            return "max_completion_tokens", self.max_completion_tokens
        return "max_tokens", self.max_tokens


class TokenizeRequest(StrictModel):
    """``POST /v1/tokenize`` (vLLM's shape): a ``prompt``, or chat ``messages`` rendered with the model's
    chat template as chat completions render them; lets clients cut a corpus into model-sized windows."""

    model: str
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = False
    return_token_strs: bool = False
    """vLLM's: each token's vocabulary string beside its id (``token_strs``)."""
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of 'prompt' or 'messages'")
        if self.messages is None and (self.continue_final_message or self.chat_template_kwargs is not None):
            raise ValueError("continue_final_message and chat_template_kwargs apply to messages")
        return self

    def size(self) -> int:
        """Characters to tokenise (``max_tokenize_chars``)."""
        if self.prompt is not None:
            return len(self.prompt)
        return sum(len(m.text()) for m in self.messages or [])


class DetokenizeRequest(StrictModel):
    """``POST /v1/detokenize`` (vLLM's shape): token ids back to text."""

    model: str
    tokens: list[int]
