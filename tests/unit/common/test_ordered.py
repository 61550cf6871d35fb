"""``cascade_common.ordered``: bounded concurrency, submission order, early results, cancellation."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from cascade_common.ordered import ordered
from hypothesis import given, settings
from hypothesis import strategies as st

Job = Callable[[], Awaitable[int]]


class Tracker:
    """Jobs that take ``ticks`` event-loop turns each (deterministic, no wall time)."""

    def __init__(self) -> None:
        self.running = self.peak = 0
        self.started: list[int] = []
        self.finished: list[int] = []
        self.cancelled: list[int] = []

    def job(self, index: int, ticks: int | None) -> Job:
        """``ticks=None``: a job that never finishes."""

        async def run() -> int:
            self.started.append(index)
            self.running += 1
            self.peak = max(self.peak, self.running)
            try:
                if ticks is None:
                    await asyncio.Event().wait()
                for _ in range(ticks or 0):
                    await asyncio.sleep(0)
            except asyncio.CancelledError:
                self.cancelled.append(index)
                raise
            finally:
                self.running -= 1
            self.finished.append(index)
            return index

        return run


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=30), st.integers(1, 8), st.lists(st.integers(0, 5), max_size=30))
def test_results_keep_submission_order_with_at_most_window_running(ticks: list[int], window: int,
                                                                   source_ticks: list[int]) -> None:
    tracker = Tracker()

    async def jobs() -> AsyncIterator[Job]:
        for i, t in enumerate(ticks):
            for _ in range(source_ticks[i] if i < len(source_ticks) else 0):
                await asyncio.sleep(0)
            yield tracker.job(i, t)

    async def main() -> list[int]:
        return [result async for result in ordered(jobs(), window)]

    assert asyncio.run(main()) == list(range(len(ticks)))
    assert tracker.peak <= window and tracker.running == 0 and not tracker.cancelled


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 10), min_size=1, max_size=12), st.integers(1, 16))
def test_first_results_come_out_while_the_source_still_waits(ticks: list[int], window: int) -> None:
    """The source blocks after its first jobs until the consumer has all their results: without
    early results this would deadlock (caught by the timeout)."""
    tracker = Tracker()
    resume = asyncio.Event

    async def main() -> list[int]:
        more = resume()

        async def jobs() -> AsyncIterator[Job]:
            for i, t in enumerate(ticks):
                yield tracker.job(i, t)
            await more.wait()
            yield tracker.job(len(ticks), 0)

        seen = []
        async for result in ordered(jobs(), window):
            seen.append(result)
            if result == len(ticks) - 1:
                more.set()
        return seen

    async def bounded() -> list[int]:
        return await asyncio.wait_for(main(), 5)

    assert asyncio.run(bounded()) == list(range(len(ticks) + 1))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 8), st.integers(0, 6), st.integers(1, 20))
def test_closing_early_cancels_the_jobs_still_running_and_the_pending_read(window: int, take: int,
                                                                          total: int) -> None:
    tracker = Tracker()
    read_cancelled = []

    async def jobs() -> AsyncIterator[Job]:
        try:
            for i in range(total):
                yield tracker.job(i, 0 if i < take else None)
            await asyncio.Event().wait()  # the source never ends
        except asyncio.CancelledError:
            read_cancelled.append(True)
            raise

    async def main() -> list[int]:
        seen: list[int] = []
        async with contextlib.aclosing(ordered(jobs(), window)) as results:
            if take == 0:  # the consumer is cancelled while it waits for the first result
                waiting = asyncio.ensure_future(anext(results))
                for _ in range(5):
                    await asyncio.sleep(0)
                waiting.cancel()
                await asyncio.gather(waiting, return_exceptions=True)
                return seen
            async for result in results:
                seen.append(result)
                if len(seen) == min(take, total):
                    break
        return seen

    seen = asyncio.run(main())
    assert seen == list(range(min(take, total)))
    assert tracker.running == 0
    assert sorted(tracker.cancelled) == sorted(set(tracker.started) - set(tracker.finished))
    assert tracker.peak <= window


def test_a_failing_job_raises_in_its_turn_and_cancels_the_rest() -> None:
    tracker = Tracker()

    async def boom() -> int:
        await asyncio.sleep(0)
        raise RuntimeError("job 1 failed")

    async def jobs() -> AsyncIterator[Job]:
        yield tracker.job(0, 50)  # long enough for job 2 to start
        yield boom
        yield tracker.job(2, None)

    async def main() -> list[int]:
        seen: list[int] = []
        with pytest.raises(RuntimeError, match="job 1 failed"):
            async for result in ordered(jobs(), 3):
                seen.append(result)
        return seen

    assert asyncio.run(main()) == [0]
    assert (tracker.started, tracker.finished, tracker.cancelled, tracker.running) == ([0, 2], [0], [2], 0)
