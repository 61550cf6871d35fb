"""A client that leaves mid-request gets its engine request aborted, and only its own.

Each test waits (by polling) until the request runs in the engine, drops the client, then waits until
the gateway's cumulative ``engine_aborts`` (``GET /ops/live-state``) grew by exactly the number of
dropped requests and the engine is idle. ``max_tokens`` fills the context, so a request that is not
aborted runs on long after the drop and adds no abort: a natural finish fails the test."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx

from tests.integration.conftest import (
    MODEL,
    Service,
    engine_aborts,
    live_state,
    unfinished_engine_requests,
    wait_for,
    wait_for_aborts,
    wait_for_async,
    wait_until_idle,
)

# The context is 1024 tokens and the prompts are a few: as long as a request can be.
LONG = 1000


def _idle_aborts(service: Service) -> int:
    """The abort count on an idle engine, so the test's drops are the only ones counted from here."""
    wait_for(lambda: unfinished_engine_requests(service) == 0, 120, "an idle engine before the test")
    return engine_aborts(service)


def _data_lines(lines: Iterator[str], count: int) -> list[str]:
    """The next ``count`` SSE data lines (the caller keeps ``lines`` alive: dropping an ``iter_lines()``
    generator closes the connection)."""
    seen: list[str] = []
    for line in lines:
        if line.startswith("data: "):
            seen.append(line)
            if len(seen) == count:
                break
    return seen


def _runner_requests(service: Service) -> int:
    """Requests the main engine's model runner holds: scheduled, so generating."""
    return int(live_state(service)["engines"]["main"]["runner_requests"])


def _outcome(task: asyncio.Task[httpx.Response]) -> str:
    """How a request that should still be running ended: its status and body, or its exception."""
    if (exc := task.exception()) is not None:
        return repr(exc)
    response = task.result()
    return f"HTTP {response.status_code}: {response.text[:300]}"


def test_dropped_stream_aborts_engine_request(service: Service) -> None:
    body: dict[str, Any] = {"model": MODEL, "prompt": "def f():\n", "max_tokens": LONG, "temperature": 1.0,
                            "ignore_eos": True, "stream": True}
    for round_ in range(3):
        before = _idle_aborts(service)
        with service.client() as client, client.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            received = _data_lines(lines, 4)
            assert len(received) == 4 and all(line.startswith("data: {") for line in received), received
            wait_for(lambda: unfinished_engine_requests(service) > 0, 30, "the streamed request running in the engine")
        # Leaving the block closed the connection mid-stream.
        wait_for_aborts(service, before, 1)
        print(f"round {round_}: the dropped stream was aborted")


def test_dropped_plain_requests_abort_their_engine_requests(service: Service) -> None:
    body = {"model": MODEL, "prompt": "def g():\n", "max_tokens": LONG, "temperature": 1.0, "ignore_eos": True}
    dropped = 2
    before = _idle_aborts(service)

    async def drop() -> None:
        async with httpx.AsyncClient(base_url=service.base_url, headers=service.headers, timeout=300) as client:
            tasks = [asyncio.create_task(client.post("/v1/completions", json={**body, "seed": i}))
                     for i in range(dropped)]
            await wait_for_async(lambda: any(task.done() for task in tasks) or _runner_requests(service) >= dropped,
                                 60, f"{dropped} plain requests generating in the engine",
                                 detail=lambda: live_state(service))
            assert not any(task.done() for task in tasks), [_outcome(task) for task in tasks if task.done()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(drop())
    wait_for_aborts(service, before, dropped)


def test_shared_request_id_hang_up_never_aborts_another_clients_request(service: Service) -> None:
    """Retries and proxies reuse trace ids: a client dropping its stream must abort only its own
    request, even when another client's request carries the same ``X-Request-Id``."""
    headers = {**service.headers, "X-Request-Id": "shared-trace-id"}
    body = {"model": MODEL, "prompt": "def h():\n", "max_tokens": LONG, "temperature": 1.0, "ignore_eos": True}
    before = _idle_aborts(service)

    async def run() -> httpx.Response:
        async with httpx.AsyncClient(base_url=service.base_url, headers=headers, timeout=300) as client:
            survivor = asyncio.create_task(client.post("/v1/completions", json=body))
            await wait_for_async(lambda: unfinished_engine_requests(service) >= 1, 60,
                                 "the survivor running in the engine")
            async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as dropped:
                assert dropped.headers["x-request-id"] == "shared-trace-id"
                first = ""
                async for line in dropped.aiter_lines():
                    if line.startswith("data: {"):
                        first = line
                        break
                assert '"error"' not in first, first
                assert not survivor.done(), (await survivor).text[:500]
                # Both generate now: the survivor was in the engine before the stream started and has not
                # finished, the stream has produced tokens. (Not polled on the engine's counts: with the two
                # sharing an X-Request-Id, /metrics and /ops/live-state were seen to show one request.)
            # The stream is closed mid-way: its engine request is aborted while the survivor runs on.
            await wait_for_async(lambda: engine_aborts(service) - before >= 1, 60, "the dropped stream's abort")
            assert not survivor.done(), "the survivor ended with the dropped stream"
            return await survivor

    response = asyncio.run(run())
    assert response.status_code == 200, response.text
    assert response.headers["x-request-id"] == "shared-trace-id"
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "length" and response.json()["usage"]["completion_tokens"] == LONG
    wait_for_aborts(service, before, 1)
    assert wait_until_idle(service) == 0
