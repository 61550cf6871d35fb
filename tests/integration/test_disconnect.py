"""A client that drops a stream mid-way leaves no request running in the engine."""

from __future__ import annotations

import asyncio

import httpx

from tests.integration.conftest import MODEL, Service, wait_until_idle


def test_dropped_stream_aborts_engine_request(service: Service) -> None:
    body = {"model": MODEL, "prompt": "def f():\n", "max_tokens": 900, "temperature": 1.0, "ignore_eos": True,
            "stream": True}
    for _ in range(3):
        with service.client() as client, client.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            received = [next(lines) for _ in range(6)]
            assert any(line.startswith("data: ") for line in received)
    assert wait_until_idle(service) == 0


def test_dropped_plain_request_aborts_engine_request(service: Service) -> None:
    body = {"model": MODEL, "prompt": "def g():\n", "max_tokens": 900, "temperature": 1.0, "ignore_eos": True}

    async def drop() -> None:
        async with httpx.AsyncClient(base_url=service.base_url, headers=service.headers) as client:
            task = asyncio.create_task(client.post("/v1/completions", json=body))
            await asyncio.sleep(1.5)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(drop())
    assert wait_until_idle(service) == 0
