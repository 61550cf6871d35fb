"""Fast checks of the gateway's pure pieces (no engine)."""

from __future__ import annotations

import pytest
from cascade.api.middleware import request_ids, sanitize_request_id
from cascade.settings import Settings, load_settings


def test_cli_flags_override_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASCADE_PORT", "9100")
    monkeypatch.setenv("CASCADE_MAX_MODEL_LEN", "512")
    settings = load_settings(["--port", "9200"])
    assert settings.port == 9200
    assert settings.max_model_len == 512


def test_served_model_name_defaults_to_model_directory_name() -> None:
    assert Settings(model="/models/some-model/").model_name == "some-model"


@pytest.mark.parametrize("value", ["../../etc/passwd", "/abs", "a" * 65, ".hidden", "x\0y", "", None])
def test_unsafe_request_ids_are_replaced(value: str | None) -> None:
    rid = sanitize_request_id(value)
    assert rid != value and len(rid) == 32 and rid.isalnum()


def test_safe_request_ids_are_kept() -> None:
    assert sanitize_request_id("req-42_a.b") == "req-42_a.b"


@pytest.mark.parametrize("value", ["trace-1", "../bad", None])
def test_engine_ids_are_server_unique_whatever_the_client_sends(value: str | None) -> None:
    (echo_a, internal_a), (echo_b, internal_b) = request_ids(value), request_ids(value)
    assert internal_a != internal_b and value not in (internal_a, internal_b)
    if value == "trace-1":
        assert echo_a == echo_b == value
    else:
        assert (echo_a, echo_b) == (internal_a, internal_b)
