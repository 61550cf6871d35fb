"""A client that drops a stream mid-way leaves no request running in the engine."""

from __future__ import annotations

import asyncio

import httpx

from tests.integration.conftest import MODEL, Service, unfinished_engine_requests, wait_until_idle


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


def test_shared_request_id_hang_up_never_aborts_another_clients_request(service: Service) -> None:
    """Retries and proxies reuse trace ids: a client dropping its stream must abort only its own
    request, even when another client's request carries the same ``X-Request-Id``."""
    headers = {**service.headers, "X-Request-Id": "shared-trace-id"}
    body = {"model": MODEL, "prompt": "def h():\n", "max_tokens": 300, "temperature": 1.0, "ignore_eos": True}

    async def run() -> httpx.Response:
        async with httpx.AsyncClient(base_url=service.base_url, headers=headers, timeout=120) as client:
            survivor = asyncio.create_task(client.post("/v1/completions", json=body))
            while not unfinished_engine_requests(service):
                await asyncio.sleep(0.05)
            async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as dropped:
                assert dropped.headers["x-request-id"] == "shared-trace-id"
                async for line in dropped.aiter_lines():
                    if line.startswith("data: {"):
                        break
            return await survivor

    response = asyncio.run(run())
    assert response.status_code == 200, response.text
    assert response.headers["x-request-id"] == "shared-trace-id"
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "length" and response.json()["usage"]["completion_tokens"] == 300
    assert wait_until_idle(service) == 0
