"""An engine's output reader is cancelled, and has ended, before the engine stops."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from cascade.vllm_compat.engine_stop import cancel_output_readers


def test_every_output_reader_is_cancelled_and_awaited() -> None:
    async def scenario() -> tuple[list[bool], list[bool]]:
        readers = [asyncio.create_task(asyncio.sleep(3600)) for _ in range(2)]
        engines = [SimpleNamespace(output_handler=reader) for reader in readers]
        engines += [SimpleNamespace(output_handler=None), SimpleNamespace()]
        await cancel_output_readers(engines)
        return [reader.done() for reader in readers], [reader.cancelled() for reader in readers]

    done, cancelled = asyncio.run(scenario())
    assert done == [True, True] and cancelled == [True, True]


def test_a_reader_that_already_failed_does_not_raise() -> None:
    async def scenario() -> bool:
        async def fail() -> None:
            raise RuntimeError("engine dead")

        reader = asyncio.create_task(fail())
        await asyncio.sleep(0)
        await cancel_output_readers([SimpleNamespace(output_handler=reader)])
        return reader.done()

    assert asyncio.run(scenario())
