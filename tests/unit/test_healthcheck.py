"""The container/k8s readiness check sends the API key, so a keyed service becomes ready."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from cascade.healthcheck import main, ready

KEY = "s3cret"


class _KeyedReady(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        ok = self.path == "/ready" and self.headers.get("Authorization") == f"Bearer {KEY}"
        self.send_response(200 if ok else 401)
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def keyed_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _KeyedReady)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/ready"
    server.shutdown()
    server.server_close()


def test_ready_with_the_key_and_not_without(keyed_server: str) -> None:
    assert ready(keyed_server, KEY)
    assert not ready(keyed_server, None)


def test_main_reads_the_key_from_the_environment(keyed_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASCADE_API_KEY", KEY)
    assert main([keyed_server]) == 0
    monkeypatch.delenv("CASCADE_API_KEY")
    assert main([keyed_server]) == 1


def test_unreachable_service_is_not_ready() -> None:
    assert main(["http://127.0.0.1:9/ready"]) == 1
