"""The batched runner: any grouping of jobs gives the same bytes, and every lane decodes back exactly."""

from __future__ import annotations

import asyncio
import contextlib
import random

import pytest
from cascade.codec.exact.runner import ExactRunner
from cascade.codec.lanes import lane_lengths, split_lanes

from tests.unit.codec.exact_fixtures import TINY, tiny_model

VOCAB = TINY["vocab_size"]


def _tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(n)]


def _runner(**kwargs: int) -> ExactRunner:
    return ExactRunner(tiny_model(), VOCAB, **kwargs)


def test_concurrent_jobs_with_mixed_settings_round_trip_and_match_their_solo_bytes() -> None:
    jobs = [(_tokens(i, 30 + 17 * i), 8 + 4 * i, (16, 24, 32)[i % 3], 1 + i * 7) for i in range(6)]

    async def main(runner: ExactRunner, together: bool) -> list[bytes]:
        async def one(tokens: list[int], lane: int, precision: int, top_k: int) -> bytes:
            coded = await runner.encode([1], split_lanes(tokens, lane), top_k, precision)
            back = await runner.decode([1], lane_lengths(len(tokens), lane), coded.payload, top_k, precision)
            assert [t for x in back for t in x] == tokens
            return coded.payload

        if together:
            return list(await asyncio.gather(*(one(*job) for job in jobs)))
        return [await one(*job) for job in jobs]

    batched, solo = _runner(max_rows=5, prefill_tokens=64), _runner(max_rows=64, prefill_tokens=100_000)
    try:
        assert asyncio.run(main(batched, True)) == asyncio.run(main(solo, False))
    finally:
        batched.close()
        solo.close()


def test_a_segment_with_more_lanes_than_rows_still_decodes() -> None:
    runner = _runner(max_rows=2)
    tokens = _tokens(9, 70)
    try:
        coded = asyncio.run(runner.encode([1, 5], split_lanes(tokens, 10), 16, 32))
        back = asyncio.run(runner.decode([1, 5], lane_lengths(70, 10), coded.payload, 16, 32))
        assert [t for x in back for t in x] == tokens
    finally:
        runner.close()


def test_a_damaged_payload_decodes_to_in_vocabulary_tokens_without_raising() -> None:
    runner = _runner()
    try:
        coded = asyncio.run(runner.encode([1], split_lanes(_tokens(3, 40), 20), 8, 24))
        damaged = bytes(b ^ 0x5A for b in coded.payload)
        back = asyncio.run(runner.decode([1], [20, 20], damaged, 8, 24))
        assert [len(x) for x in back] == [20, 20]
        assert all(0 <= t < VOCAB for x in back for t in x)
    finally:
        runner.close()


def test_cancelled_jobs_leave_no_live_state() -> None:
    runner = _runner(max_rows=4)

    async def main() -> None:
        coded = await runner.encode([1], split_lanes(_tokens(4, 120), 60), 8, 32)
        task = asyncio.ensure_future(runner.decode([1], [60, 60], coded.payload, 8, 32))
        await asyncio.sleep(0.05)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for _ in range(200):
            if runner.live_jobs() == 0:
                return
            await asyncio.sleep(0.05)

    try:
        asyncio.run(main())
        assert runner.live_jobs() == 0
    finally:
        runner.close()


def test_a_closed_runner_refuses_new_jobs() -> None:
    runner = _runner()
    runner.close()
    with pytest.raises(RuntimeError, match="shut down"):
        asyncio.run(runner.encode([1], [[2, 3]], 8, 16))
