"""A streamed top-k export renders its batches off the event loop, so other requests keep being served."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from cascade.api.topk_export import STREAM_BATCH, _sse
from cascade.export.token_table import TokenTable
from cascade.export.topk import ExportPosition
from cascade.metrics import Metrics

K = 8
POSITIONS = 3 * STREAM_BATCH + 5


class Engines:
    async def export(self, prompt: list[int], export: Any, request_id: str) -> list[ExportPosition]:
        ids = tuple(range(K))
        return [ExportPosition(i, i % K, ids, tuple(-float(j + 1) for j in ids), -1.0, 1)
                for i in range(1, POSITIONS + 1)]


def test_each_streamed_export_batch_lets_the_event_loop_serve_others() -> None:
    table = TokenTable(tuple(f"t{i}" for i in range(K)), tuple(f"t{i}".encode() for i in range(K)))
    settings = SimpleNamespace(model_name="m")

    async def scenario() -> tuple[list[bytes], int]:
        ticks = 0

        async def other_requests() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        ticker = asyncio.create_task(other_requests())
        events = [event async for event in _sse(Engines(), [[0] * (POSITIONS + 1)], None, K, "rid", 0,  # type: ignore[arg-type]
                                                settings, table, Metrics(), include_usage=False)]  # type: ignore[arg-type]
        ticker.cancel()
        return events, ticks

    events, ticks = asyncio.run(scenario())
    chunks = [json.loads(event.decode().removeprefix("data: ")) for event in events]
    contents = [chunk["choices"][0]["logprobs"]["content"] for chunk in chunks]
    assert [len(content) for content in contents] == [STREAM_BATCH] * 3 + [5]
    assert [chunk["choices"][0]["logprobs"]["offset"] for chunk in chunks] == [1, 65, 129, 193]
    assert [chunk["choices"][0]["finish_reason"] for chunk in chunks] == [None, None, None, "length"]
    assert ticks >= len(events)
