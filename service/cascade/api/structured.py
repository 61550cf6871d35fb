"""``response_format`` → a compact JSON grammar for the engine's structured outputs.

vLLM's xgrammar backend takes "no whitespace between JSON tokens" only as an engine-wide setting
(``structured_outputs_config.disable_any_whitespace``); per request it allows any whitespace, and
a small model then pads with tabs and newlines until ``max_tokens``, so the SDK's ``parse`` fails
on a cut-off reply. Compiling the schema here with xgrammar (vLLM's own backend library) into a
grammar without free whitespace gives the same constraint per request."""

from __future__ import annotations

import json
import re
from typing import Any

from cascade.api.errors import APIError
from cascade.api.openai_protocol import ChatCompletionRequest

ANY_OBJECT: dict[str, Any] = {"type": "object"}


_XGRAMMAR_LOCATION = re.compile(r"^\[[\d:]+\]\s+\S+:\d+:\s*")


def compact_json_grammar(schema: dict[str, Any]) -> str:
    """EBNF for JSON documents valid under ``schema``, written as ``json.dumps(..., separators=(",", ":"))``."""
    import xgrammar

    try:
        grammar = xgrammar.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))
    except Exception as exc:
        reason = _XGRAMMAR_LOCATION.sub("", str(exc)).strip()  # "[14:06:30] /project/cpp/…cc:4944: " is not the user's
        raise APIError(400, f"response_format.json_schema.schema is not a usable JSON schema: {reason}",
                       param="response_format.json_schema.schema", code="invalid_value") from None
    return str(grammar)


def response_grammar(request: ChatCompletionRequest) -> str | None:
    """``json_object`` constrains the reply to a JSON object, ``json_schema`` to the schema
    (always enforced, ``strict`` or not); ``text`` or no format leaves sampling free."""
    response_format = request.response_format
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return compact_json_grammar(ANY_OBJECT)
    if response_format.json_schema is None:
        raise APIError(400, "response_format type 'json_schema' needs a json_schema", param="response_format")
    return compact_json_grammar(response_format.json_schema.schema_)
