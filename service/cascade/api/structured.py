"""``response_format`` and vLLM's ``structured_outputs`` → the engine's ``Constraint``.

JSON (a schema, or any object) becomes a compact JSON grammar; a regex, a choice or a grammar
goes to the engine as given (vLLM refuses what its backend cannot compile: a 400).

vLLM's xgrammar backend takes "no whitespace between JSON tokens" only as an engine-wide setting
(``structured_outputs_config.disable_any_whitespace``); per request it allows any whitespace, and
a small model then pads with tabs and newlines until ``max_tokens``, so the SDK's ``parse`` fails
on a cut-off reply. Compiling the schema here with xgrammar (vLLM's own backend library) into a
grammar without free whitespace gives the same constraint per request."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from cascade.api.errors import APIError
from cascade.api.openai_protocol import SamplingFields
from cascade.engine.types import Constraint
from cascade.settings import Settings

ANY_OBJECT: dict[str, Any] = {"type": "object"}


_XGRAMMAR_LOCATION = re.compile(r"^\[[\d:]+\]\s+\S+:\d+:\s*")


def nesting_depth(value: object) -> int:
    """How deeply JSON objects and arrays nest in ``value`` (a scalar: 0). Iterative: any depth is safe."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in children)
    return deepest


def _compile(text: str, param: str, any_whitespace: bool, strict: bool) -> str:
    import xgrammar

    try:
        grammar = xgrammar.Grammar.from_json_schema(text, any_whitespace=any_whitespace, strict_mode=strict,
                                                    separators=None if any_whitespace else (",", ":"))
    except Exception as exc:
        reason = _XGRAMMAR_LOCATION.sub("", str(exc)).strip()  # "[14:06:30] /project/cpp/…cc:4944: " is not the user's
        raise APIError(400, f"{param} is not a usable JSON schema: {reason}", param=param,
                       code="invalid_value") from None
    return str(grammar)


def _check_size(size: int, settings: Settings, param: str, what: str) -> None:
    if size > settings.max_grammar_bytes:
        raise APIError(400, f"{param} {what} {size} bytes; at most {settings.max_grammar_bytes} are allowed "
                            "(max_grammar_bytes)", param=param, code="invalid_value")


async def json_grammar(schema: dict[str, Any] | str, settings: Settings,
                       param: str = "response_format.json_schema.schema", *, any_whitespace: bool = False,
                       strict: bool = True) -> str:
    """EBNF for JSON documents valid under ``schema``, written compactly as ``json.dumps(...,
    separators=(",", ":"))`` unless ``any_whitespace`` (any whitespace between tokens, vLLM's default);
    ``strict``: no property the schema does not name.

    Compiled in a worker thread (xgrammar releases the GIL), and only for a schema nested at most
    ``max_schema_depth`` deep (compile time grows with the cube of the depth: 400 levels took 8.8 s
    of a core) whose text and grammar fit in ``max_grammar_bytes`` (the engine compiles the grammar
    again, in time and memory that grow faster than its size)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except (ValueError, RecursionError):
            raise APIError(400, f"{param} is not valid JSON", param=param, code="invalid_value") from None
    depth = nesting_depth(schema)
    if depth > settings.max_schema_depth:
        raise APIError(400, f"{param} nests {depth} levels deep; at most {settings.max_schema_depth} are allowed "
                            "(max_schema_depth)", param=param, code="invalid_value")
    text = json.dumps(schema)
    _check_size(len(text.encode()), settings, param, "has")
    grammar = await asyncio.to_thread(_compile, text, param, any_whitespace, strict)
    _check_size(len(grammar.encode()), settings, param, "compiles to a grammar of")
    return grammar


async def _response_format_grammar(request: SamplingFields, settings: Settings) -> str | None:
    """``json_object`` constrains the reply to a JSON object, ``json_schema`` to the schema
    (always enforced, ``strict`` or not); ``text`` or no format leaves sampling free."""
    response_format = request.response_format
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return await json_grammar(ANY_OBJECT, settings)
    if response_format.json_schema is None:
        raise APIError(400, "response_format type 'json_schema' needs a json_schema", param="response_format")
    return await json_grammar(response_format.json_schema.schema_, settings)


async def output_constraint(request: SamplingFields, settings: Settings) -> Constraint | None:
    """What sampling must obey: ``response_format`` (OpenAI's) or ``structured_outputs`` (vLLM's), not both."""
    grammar = await _response_format_grammar(request, settings)
    wanted = request.structured_outputs
    if wanted is None:
        return None if grammar is None else Constraint(grammar=grammar, source="response_format")
    if grammar is not None:
        raise APIError(400, "give response_format or structured_outputs, not both", param="structured_outputs")
    source = "structured_outputs"
    spaced, strict = wanted.disable_any_whitespace is False, wanted.disable_additional_properties is not False
    if wanted.json_object or wanted.json_ is not None:
        schema: dict[str, Any] | str = ANY_OBJECT if wanted.json_ is None else wanted.json_
        param = "structured_outputs.json_object" if wanted.json_object else "structured_outputs.json"
        return Constraint(grammar=await json_grammar(schema, settings, param, any_whitespace=spaced,
                                                     strict=strict), source=source)
    if wanted.choice is not None:
        _check_size(sum(len(c.encode()) for c in wanted.choice), settings, "structured_outputs.choice", "holds")
        return Constraint(choice=tuple(wanted.choice), source=source)
    given = "grammar" if wanted.grammar is not None else "regex"
    _check_size(len((wanted.grammar or wanted.regex or "").encode()), settings, f"structured_outputs.{given}", "has")
    return Constraint(grammar=wanted.grammar, regex=wanted.regex, source=source)
