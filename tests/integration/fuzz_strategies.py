"""Hypothesis strategies for request bodies, derived from the routes' pydantic JSON schemas.

Values are mostly valid-looking with a share of hostile ones (lone surrogates, huge and negative
integers, extreme floats, wrong types, unknown fields). Counts that cost engine time (max_tokens,
steps, n, ...) are kept small when valid, so thousands of cases run in minutes.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from pydantic import BaseModel

COSTLY = {"max_tokens": 4, "max_completion_tokens": 4, "steps": 3, "beam_width": 3, "n": 2, "tokens": 4,
          "max_edit_distance": 2, "compression_top_k": 8, "top_logprobs": 3, "logprobs": 3, "min_tokens": 3}
HOSTILE_INTS = st.sampled_from([-1, 0, 2**31, 2**63, 2**64, 2**70, -(2**64), 10**30])
HOSTILE_FLOATS = st.sampled_from([5e-324, -0.0, 1e308, -1e308, 1e-300, 3.5, -2.5])
TEXT = st.one_of(st.text(max_size=40), st.sampled_from(["\ud800", "a\udfffb", "", " ", "\x00", "import os\n"]))
JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), TEXT)


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _from_schema(schema: dict[str, Any], defs: dict[str, Any], name: str = "", depth: int = 0) -> Any:
    schema = _resolve(schema, defs)
    if "anyOf" in schema or "oneOf" in schema:
        return st.one_of([_from_schema(s, defs, name, depth) for s in schema.get("anyOf", schema.get("oneOf"))])
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.one_of(st.sampled_from(schema["enum"]), TEXT)
    kind = schema.get("type")
    if kind == "integer":
        if name in COSTLY:
            return st.one_of(st.integers(0, COSTLY[name]), HOSTILE_INTS)
        return st.one_of(st.integers(-5, 10_000), HOSTILE_INTS)
    if kind == "number":
        return st.one_of(st.floats(-3, 3, allow_nan=False), HOSTILE_FLOATS)
    if kind == "boolean":
        return st.booleans()
    if kind == "string":
        return TEXT
    if kind == "array":
        items = _from_schema(schema.get("items", {}), defs, name, depth + 1) if depth < 3 else JSON_LEAF
        return st.lists(items, max_size=4)
    if kind == "object" or "properties" in schema:
        if depth >= 3 or "properties" not in schema:
            return st.dictionaries(TEXT, JSON_LEAF, max_size=3)
        props = schema["properties"]
        required = set(schema.get("required", []))
        fields = {k: _from_schema(v, defs, k, depth + 1) for k, v in props.items()}
        return st.fixed_dictionaries({k: v for k, v in fields.items() if k in required},
                                     optional={k: v for k, v in fields.items() if k not in required})
    return JSON_LEAF


def request_bodies(model: type[BaseModel], fixed: dict[str, Any] | None = None) -> st.SearchStrategy[Any]:
    """Bodies shaped like ``model`` (fields in ``fixed`` pinned, e.g. a valid model name), sometimes
    with an unknown field or replaced by arbitrary JSON."""
    schema = model.model_json_schema()
    body = _from_schema(schema, schema.get("$defs", {}))
    pinned = body.map(lambda b: {**b, **(fixed or {})}) if fixed else body
    extra = pinned.flatmap(lambda b: st.dictionaries(TEXT, JSON_LEAF, max_size=1).map(lambda e: {**b, **e}))
    return st.one_of(pinned, pinned, pinned, extra, JSON_LEAF, st.lists(JSON_LEAF, max_size=3))
