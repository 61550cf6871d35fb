"""Request models of OpenAI's Responses API: what ``client.responses.create`` sends. Unknown fields are
rejected, as on the rest of the OpenAI surface."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from cascade.api.openai_protocol import Metadata, StrictModel


class TextPart(StrictModel):
    """A message's text: ``input_text``, or ``output_text`` / ``refusal`` of an earlier reply sent back
    (the SDK's ``response.output`` items carry annotations and logprobs, which are not read)."""

    type: Literal["input_text", "output_text", "refusal"]
    text: str | None = None
    refusal: str | None = None
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None

    @model_validator(mode="after")
    def _has_its_text(self) -> TextPart:
        field = "refusal" if self.type == "refusal" else "text"
        if getattr(self, field) is None:
            raise ValueError(f"a {self.type} part needs its {field}")
        return self


class InputMessage(StrictModel):
    """An input item of type ``message``, or an earlier output message sent back."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | Annotated[list[TextPart], Field(min_length=1)]
    id: str | None = None
    status: str | None = None
    phase: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or part.refusal or "" for part in self.content)


class TextFormat(StrictModel):
    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")] | None = None
    schema_: Annotated[dict[str, Any] | None, Field(alias="schema")] = None
    description: str | None = None
    strict: bool | None = None

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class TextConfig(StrictModel):
    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None
    """Only the default: this model has no verbosity setting."""


class StreamOptions(StrictModel):
    include_obfuscation: bool | None = None


class ResponsesRequest(StrictModel):
    """What ``client.responses.create`` sends. Tools, reasoning and background runs would change the
    result and this model has none of them: a 400 naming the field."""

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    include: list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    store: bool = True
    previous_response_id: str | None = None
    text: TextConfig | None = None
    truncation: Literal["auto", "disabled"] | None = None
    user: str | None = None
    metadata: Metadata | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    parallel_tool_calls: bool | None = None
    tool_choice: Literal["none", "auto"] | None = None
    tools: list[dict[str, Any]] | None = None
    reasoning: dict[str, Any] | None = None
    background: bool | None = None
