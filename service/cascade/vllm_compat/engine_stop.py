"""Stopping an ``AsyncLLM`` without a spurious ERROR: its output reader is cancelled first.

vLLM 0.32's ``AsyncLLM.shutdown`` stops the engine core and only then cancels ``output_handler``, the
task reading the core's outputs; in between that task can read the core's exit as a failure and log
``AsyncLLM output_handler failed … EngineDeadError`` at a normal stop (1 stop in 5 here). The attribute
is vLLM's, so it is read here, and the contract checks that ``__init__`` still sets it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any


async def cancel_output_readers(engines: Iterable[Any]) -> None:
    """Cancel each engine's output reader on the running loop and wait for it to end."""
    readers = [reader for engine in engines if (reader := getattr(engine, "output_handler", None)) is not None]
    for reader in readers:
        reader.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
