"""Bounded, in-order concurrency: run jobs a window at a time, yield results in submission order."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def ordered(jobs: AsyncIterator[Callable[[], Awaitable[T]]], window: int) -> AsyncGenerator[T, None]:
    """Run up to ``window`` jobs at once, yielding results in submission order — each as soon as it and
    every job before it are done, even while the source is still waiting for input (a streamed upload
    gets its first records back before it ends).

    A job that fails raises its error here, in its turn. Closing the generator early (``aclose``, e.g.
    through ``contextlib.aclosing``), or an error, cancels the jobs still running and the pending
    read of ``jobs``."""
    pending: deque[asyncio.Future[T]] = deque()
    next_job: asyncio.Future[Callable[[], Awaitable[T]]] | None = None
    exhausted = False
    try:
        while True:
            if not exhausted and next_job is None and len(pending) < window:
                next_job = asyncio.ensure_future(anext(jobs))
            waiting: set[asyncio.Future[Any]] = {f for f in (next_job, pending[0] if pending else None) if f}
            if not waiting:
                return
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if pending and pending[0].done():
                yield pending.popleft().result()
            elif next_job is not None and next_job.done():
                try:
                    job = next_job.result()
                except StopAsyncIteration:
                    exhausted = True
                else:
                    pending.append(asyncio.ensure_future(job()))
                next_job = None
    finally:
        leftovers: list[asyncio.Future[Any]] = [*pending, *([next_job] if next_job is not None else [])]
        for task in leftovers:
            task.cancel()
        await asyncio.gather(*leftovers, return_exceptions=True)
