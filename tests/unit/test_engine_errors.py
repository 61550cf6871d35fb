"""vLLM's request-validation errors (not ``ValueError``s) become Cascade's ``EngineRequestError`` in the
adapter, and OpenAI-shaped 400s at the API; only vLLM's engine-died error becomes a 503."""

from __future__ import annotations

from cascade.api.errors import as_api_error, is_engine_failure
from cascade.api.streaming import error_payload
from cascade.engine.params import translate_error
from cascade.engine.types import EngineFailedError, EngineRequestError
from vllm.exceptions import VLLMValidationError
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError


def test_vllm_validation_error_is_a_400_naming_its_parameter() -> None:
    error = translate_error(VLLMValidationError("bad_words entries must tokenize", parameter="bad_words",
                                                value=[""]))
    assert isinstance(error, EngineRequestError)
    api = as_api_error(error)
    assert api is not None
    assert (api.status, api.param, api.code) == (400, "bad_words", "invalid_value")
    assert "bad_words entries must tokenize" in api.message


def test_other_errors_are_not_client_errors() -> None:
    assert translate_error(RuntimeError("boom")) is None
    assert as_api_error(RuntimeError("boom")) is None


def test_only_a_dead_engine_is_an_engine_failure() -> None:
    dead = translate_error(EngineDeadError())
    assert isinstance(dead, EngineFailedError) and is_engine_failure(dead)
    assert translate_error(EngineGenerateError()) is None


def test_stream_error_event_for_a_vllm_validation_error_says_400() -> None:
    error = translate_error(VLLMValidationError("n must be 1 when using greedy sampling"))
    assert error is not None
    payload = error_payload(error)
    assert payload["error"]["status"] == 400
    assert payload["error"]["type"] == "invalid_request_error"
