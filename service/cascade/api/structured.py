"""``response_format`` and vLLM's ``structured_outputs`` → the engine's ``Constraint``.

JSON (a schema, or any object) becomes a compact JSON grammar; a regex, a choice or a grammar
goes to the engine as given (vLLM refuses what its backend cannot compile: a 400).

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
from cascade.api.openai_protocol import SamplingFields
from cascade.engine.types import Constraint

ANY_OBJECT: dict[str, Any] = {"type": "object"}


_XGRAMMAR_LOCATION = re.compile(r"^\[[\d:]+\]\s+\S+:\d+:\s*")


def compact_json_grammar(schema: dict[str, Any] | str, param: str = "response_format.json_schema.schema") -> str:
    """EBNF for JSON documents valid under ``schema``, written as ``json.dumps(..., separators=(",", ":"))``."""
    import xgrammar

    try:
        text = schema if isinstance(schema, str) else json.dumps(schema)
        grammar = xgrammar.Grammar.from_json_schema(text, any_whitespace=False, separators=(",", ":"))
    except Exception as exc:
        reason = _XGRAMMAR_LOCATION.sub("", str(exc)).strip()  # "[14:06:30] /project/cpp/…cc:4944: " is not the user's
        raise APIError(400, f"{param} is not a usable JSON schema: {reason}", param=param,
                       code="invalid_value") from None
    return str(grammar)


def _response_format_grammar(request: SamplingFields) -> str | None:
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


def output_constraint(request: SamplingFields) -> Constraint | None:
    """What sampling must obey: ``response_format`` (OpenAI's) or ``structured_outputs`` (vLLM's), not both."""
    grammar = _response_format_grammar(request)
    wanted = request.structured_outputs
    if wanted is None:
        return None if grammar is None else Constraint(grammar=grammar)
    if grammar is not None:
        raise APIError(400, "give response_format or structured_outputs, not both", param="structured_outputs")
    if wanted.json_object:
        return Constraint(grammar=compact_json_grammar(ANY_OBJECT))
    if wanted.json_ is not None:
        return Constraint(grammar=compact_json_grammar(wanted.json_, "structured_outputs.json"))
    if wanted.choice is not None:
        return Constraint(choice=tuple(wanted.choice))
    return Constraint(grammar=wanted.grammar, regex=wanted.regex)
