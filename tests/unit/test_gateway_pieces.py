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


def test_probes_and_scrapes_never_take_a_request_slot() -> None:
    """With one slot, a scrape still waiting for its answer must not make a real request a 429."""
    import asyncio
    from typing import Any

    import httpx
    from cascade.api.middleware import GatewayMiddleware
    from cascade.metrics import Metrics

    async def run() -> tuple[int, int]:
        entered, release = asyncio.Event(), asyncio.Event()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["path"] == "/metrics":
                entered.set()
                await release.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

        gateway = GatewayMiddleware(app, Settings(max_concurrent_requests=1), Metrics())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway), base_url="http://t") as client:
            scrape = asyncio.create_task(client.get("/metrics"))
            await entered.wait()
            served = await client.get("/v1/models")
            release.set()
            return served.status_code, (await scrape).status_code

    assert asyncio.run(run()) == (200, 200)
