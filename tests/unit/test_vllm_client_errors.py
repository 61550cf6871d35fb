"""vLLM's request-validation errors (not ``ValueError``s) become OpenAI-shaped 400s."""

from __future__ import annotations

from cascade.api.errors import vllm_client_error
from cascade.api.streaming import error_payload
from vllm.exceptions import VLLMValidationError


def test_vllm_validation_error_is_a_400_naming_its_parameter() -> None:
    error = vllm_client_error(VLLMValidationError("bad_words entries must tokenize", parameter="bad_words",
                                                  value=[""]))
    assert error is not None
    assert (error.status, error.param) == (400, "bad_words")
    assert "bad_words entries must tokenize" in error.message


def test_other_errors_are_not_client_errors() -> None:
    assert vllm_client_error(RuntimeError("boom")) is None


def test_stream_error_event_for_a_vllm_validation_error_says_400() -> None:
    payload = error_payload(VLLMValidationError("n must be 1 when using greedy sampling"))
    assert payload["error"]["status"] == 400
    assert payload["error"]["type"] == "invalid_request_error"
