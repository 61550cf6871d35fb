"""One real HTTP server (uvicorn, the real app and middleware) whose engine adapter is ``FakeEngines``."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import uvicorn
from cascade.app import create_app
from cascade.lifecycle import Gateway
from cascade.settings import Settings

from tests.routes.fake_engine import FakeEngines

API_KEY = "route-tier-key"


@dataclass
class FakeService:
    base_url: str
    gateway: Gateway
    engines: FakeEngines

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {API_KEY}"}

    def client(self, **kwargs: object) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, headers=self.headers, timeout=30, **kwargs)  # type: ignore[arg-type]

    def reset(self) -> FakeEngines:
        """A fresh fake for the next test (failures and delays set by one test never leak)."""
        self.engines = FakeEngines(tokenizer=self.engines.tokenizer)
        self.gateway.engines = self.engines  # type: ignore[assignment]
        return self.engines


@pytest.fixture(scope="session")
def fake_service() -> Iterator[FakeService]:
    settings = Settings(enable_codec=False, api_key=API_KEY, request_timeout_seconds=20.0)  # type: ignore[arg-type]
    app = create_app(settings)
    gateway: Gateway = app.state.gateway
    engines = FakeEngines()
    gateway.engines = engines  # type: ignore[assignment]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not (server.started and gateway.started.is_set()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started and gateway.started.is_set(), "the route-tier server did not start"
    yield FakeService(f"http://127.0.0.1:{port}", gateway, engines)
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def service(fake_service: FakeService) -> FakeService:
    fake_service.reset()
    return fake_service
