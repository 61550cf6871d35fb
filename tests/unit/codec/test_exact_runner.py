"""The batched runner: any grouping of jobs gives the same bytes, and every lane decodes back exactly."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import threading
from collections.abc import Callable
from pathlib import Path

import cascade.codec.exact.runner as runner_module
import pytest
from cascade.codec.exact.runner import ExactRunner, SegmentTooLargeError
from cascade.codec.lanes import LaneDecoder, LaneSymbols, encode_lanes, lane_lengths, split_lanes

from tests.unit.codec.exact_fixtures import tiny_model
from tests.unit.codec.numerics_matrix import PYCODER, pycoder

VOCAB = tiny_model().config.vocab_size


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


@pytest.mark.parametrize("weighted", [True, False], ids=["version 4", "version 3"])
def test_escaped_tokens_round_trip_as_either_container_version_codes_them(weighted: bool) -> None:
    runner = _runner(max_rows=3)
    tokens = _tokens(11, 90)
    try:
        coded = asyncio.run(runner.encode([1], split_lanes(tokens, 20), 2, 24, weighted_escapes=weighted))
        other = asyncio.run(runner.encode([1], split_lanes(tokens, 20), 2, 24, weighted_escapes=not weighted))
        back = asyncio.run(runner.decode([1], lane_lengths(90, 20), coded.payload, 2, 24, weighted_escapes=weighted))
        assert [t for x in back for t in x] == tokens
        assert coded.payload != other.payload
    finally:
        runner.close()


def test_version_4_codes_text_in_fewer_bytes_than_version_3_at_the_models_own_cross_entropy() -> None:
    """Escapes under the model's weights: the default model's code for real Python text is shorter than
    with uniform escape ranks, and within 0.5 % of the model's own cross-entropy."""
    from transformers import AutoTokenizer

    model = pycoder()
    tokens = AutoTokenizer.from_pretrained(str(PYCODER)).encode(
        Path(json.__file__).read_text()[:6000], add_special_tokens=False)
    runner = ExactRunner(model, model.config.vocab_size, max_rows=8)
    try:
        lanes = split_lanes(tokens, 200)
        v4 = asyncio.run(runner.encode([1], lanes, 64, 32, weighted_escapes=True))
        v3 = asyncio.run(runner.encode([1], lanes, 64, 32, weighted_escapes=False))
        back = asyncio.run(runner.decode([1], [len(x) for x in lanes], v4.payload, 64, 32))
        assert back == lanes
        assert len(v4.payload) < len(v3.payload)
        assert 8 * len(v4.payload) < 1.005 * v4.ideal_bits + 64
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


# -- scheduling and admission (steps are counted, never timed) -------------------------------------

def _fast(**kwargs: int) -> ExactRunner:
    """One matrix thread: the tiny model's steps are far faster without OpenMP hand-offs."""
    return ExactRunner(tiny_model(), VOCAB, threads=1, **kwargs)


async def _until(predicate: Callable[[], bool], polls: int = 2000) -> None:
    for _ in range(polls):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the runner never reached the expected state")


def _events(runner: ExactRunner, kind: str, request: object) -> list[tuple[int, int]]:
    return [(queued, step) for k, key, queued, step in list(runner.stats.events) if k == kind and key is request]


class _Gate:
    """Holds the worker at the ``after``-th call of a hooked function until released, so a test acts
    while the worker is surely mid-work (no timing involved)."""

    def __init__(self, after: int = 1) -> None:
        self.after = after
        self.calls = 0
        self.reached = threading.Event()
        self.release = threading.Event()

    def hold(self) -> None:
        self.calls += 1
        if self.calls >= self.after and not self.release.is_set():
            self.reached.set()
            self.release.wait(timeout=60)

    def on_decoder(self, monkeypatch: pytest.MonkeyPatch) -> None:
        gate = self

        class Held(LaneDecoder):
            def target(self) -> int:
                gate.hold()
                return super().target()

        monkeypatch.setattr(runner_module, "LaneDecoder", Held)

    def on_encoder(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def held(lanes: list[LaneSymbols], precision_bits: int) -> bytes:
            self.hold()
            return encode_lanes(lanes, precision_bits)

        monkeypatch.setattr(runner_module, "encode_lanes", held)


def _segments(count: int, lanes: int, lane: int, seed: int = 0) -> list[list[int]]:
    return [_tokens(seed + i, lanes * lane) for i in range(count)]


async def _encode_all(runner: ExactRunner, segments: list[list[int]], lane: int) -> list[bytes]:
    return [(await runner.encode([1], split_lanes(tokens, lane), 8, 32)).payload for tokens in segments]


def test_a_segment_arriving_mid_flight_joins_the_running_cohort_and_decodes_as_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gate = _Gate(after=11)  # the first segment's sixth step
    gate.on_decoder(monkeypatch)
    runner = _fast(max_rows=8)
    segments = _segments(3, 2, 30, seed=40)

    async def main() -> None:
        payloads = await _encode_all(runner, segments, 30)
        first, later = object(), object()
        running = asyncio.ensure_future(runner.decode([1], [30, 30], payloads[0], 8, 32, request=first))
        await _until(gate.reached.is_set)
        joining = [asyncio.ensure_future(runner.decode([1], [30, 30], p, 8, 32, request=later)) for p in payloads[1:]]
        await _until(lambda: runner.live_jobs() == 3)
        gate.release.set()
        backs = [await running, *[await job for job in joining]]
        assert [[t for x in back for t in x] for back in backs] == segments
        (_, first_done), = _events(runner, "decode-done", first)
        assert all(start < first_done for _, start in _events(runner, "decode-start", later))

    try:
        asyncio.run(main())
    finally:
        gate.release.set()
        runner.close()


def test_a_new_requests_first_segment_joins_at_the_next_step_while_a_large_request_fills_the_rows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gate = _Gate()
    gate.on_decoder(monkeypatch)
    lane = 40
    runner = _fast(max_rows=4)
    large_segments = _segments(8, 2, lane, seed=50)
    small_segment = _tokens(99, 2 * lane)

    async def main() -> None:
        payloads = await _encode_all(runner, [*large_segments, small_segment], lane)
        large, small = object(), object()
        flood = [asyncio.ensure_future(runner.decode([1], [lane, lane], p, 8, 32, request=large))
                 for p in payloads[:-1]]
        await _until(gate.reached.is_set)
        solo = asyncio.ensure_future(runner.decode([1], [lane, lane], payloads[-1], 8, 32, request=small))
        await _until(lambda: runner.live_jobs() == 9)
        gate.release.set()
        back = await solo
        assert [t for x in back for t in x] == small_segment
        (queued, started), = _events(runner, "decode-start", small)
        assert started - queued <= 1  # the next step: a first segment waits for the KV budget only
        assert [[t for x in await f for t in x] for f in flood] == large_segments
        later = [start for _, start in _events(runner, "decode-start", large) if start >= started]
        assert len(later) == 6  # served ahead of every large segment still queued when it came

    try:
        asyncio.run(main())
    finally:
        gate.release.set()
        runner.close()


def test_a_new_requests_first_segment_starts_within_one_lane_of_steps_while_a_large_request_fills_the_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gate = _Gate()
    gate.on_decoder(monkeypatch)
    lane = 40
    probe = _fast()
    budget = probe.row_position_bytes * 4 * lane  # two 2-lane segments
    probe.close()
    runner = _fast(max_rows=64, kv_budget_bytes=budget)
    large_segments = _segments(8, 2, lane, seed=55)
    small_segment = _tokens(97, 2 * lane)

    async def main() -> None:
        payloads = await _encode_all(runner, [*large_segments, small_segment], lane)
        large, small = object(), object()
        flood = [asyncio.ensure_future(runner.decode([1], [lane, lane], p, 8, 32, request=large))
                 for p in payloads[:-1]]
        await _until(gate.reached.is_set)
        solo = asyncio.ensure_future(runner.decode([1], [lane, lane], payloads[-1], 8, 32, request=small))
        await _until(lambda: runner.live_jobs() == 9)
        gate.release.set()
        assert [t for x in await solo for t in x] == small_segment
        (queued, started), = _events(runner, "decode-start", small)
        assert started - queued <= lane + 1  # the module's bound: P + 1 steps, P = the longest lane left
        assert [[t for x in await f for t in x] for f in flood] == large_segments
        later = [start for _, start in _events(runner, "decode-start", large) if start >= started]
        assert len(later) == 6  # served ahead of every large segment still queued when it came
        assert runner.stats.peak_kv_bytes <= budget

    try:
        asyncio.run(main())
    finally:
        gate.release.set()
        runner.close()


def test_a_new_requests_compression_interleaves_with_a_large_upload_within_the_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gate = _Gate()
    gate.on_encoder(monkeypatch)
    lane = 20
    runner = _fast(prefill_tokens=3 * (lane + 1))
    large_segments = _segments(6, 8, lane, seed=60)
    small_segment = _tokens(98, 2 * lane)

    async def main() -> None:
        large, small = object(), object()
        flood = [asyncio.ensure_future(runner.encode([1], split_lanes(t, lane), 8, 32, request=large))
                 for t in large_segments]
        await _until(gate.reached.is_set)
        solo = asyncio.ensure_future(runner.encode([1], split_lanes(small_segment, lane), 8, 32, request=small))
        await _until(lambda: runner.live_jobs() == 7)
        gate.release.set()
        await solo
        (queued, done), = _events(runner, "encode-done", small)
        assert done - queued <= 2 * 2 + 1  # R·L + 1 steps, R = 2 requests, L = 2 lanes
        assert len([s for _, s in _events(runner, "encode-done", large) if s <= done]) <= 2
        solo_runner = _fast()
        try:
            expected = [(await solo_runner.encode([1], split_lanes(t, lane), 8, 32)).payload for t in large_segments]
        finally:
            solo_runner.close()
        assert [(await f).payload for f in flood] == expected

    try:
        asyncio.run(main())
    finally:
        gate.release.set()
        runner.close()


def test_a_segment_whose_cache_could_never_fit_the_budget_is_refused_before_any_work() -> None:
    probe = _fast()
    per_position = probe.row_position_bytes
    probe.close()
    runner = _fast(kv_budget_bytes=per_position * 2 * 40)
    try:
        with pytest.raises(SegmentTooLargeError, match="budget") as refused:
            asyncio.run(runner.decode([1], [40, 40, 40, 40], b"\x00" * 8, 8, 32))
        assert refused.value.code == "container_too_large"
        assert runner.stats.steps == 0 and runner.live_jobs() == 0
        assert runner.max_segment_rows(40) == 2
    finally:
        runner.close()


def test_decode_cache_stays_within_its_budget_while_more_segments_wait() -> None:
    lane = 24
    probe = _fast()
    budget = probe.row_position_bytes * 4 * lane  # two 2-lane segments of lane positions at a time
    probe.close()
    runner = _fast(max_rows=64, kv_budget_bytes=budget)
    segments = _segments(6, 2, lane, seed=70)

    async def main() -> None:
        payloads = await _encode_all(runner, segments, lane)
        backs = await asyncio.gather(*(runner.decode([1], [lane, lane], p, 8, 32) for p in payloads))
        assert [[t for x in back for t in x] for back in backs] == segments

    try:
        asyncio.run(main())
        assert 0 < runner.stats.peak_kv_bytes <= budget
    finally:
        runner.close()


class _StopsPastItsPayload(LaneDecoder):
    """The range decoder as it will be (helper B): a stream read past its end fails its segment."""

    def target(self) -> int:
        if self.decoder.padded_bytes > 16:
            raise ValueError("the decoder read past the end of its payload")
        return super().target()


def test_a_segment_whose_stream_fails_fails_alone_and_drops_its_rows_at_once(monkeypatch: pytest.MonkeyPatch
                                                                             ) -> None:
    monkeypatch.setattr(runner_module, "LaneDecoder", _StopsPastItsPayload)
    lane = 30
    runner = _fast(max_rows=16)
    segments = _segments(3, 2, lane, seed=80)

    async def main() -> None:
        payloads = await _encode_all(runner, segments, lane)
        payloads[1] = payloads[1][:3]
        results = await asyncio.gather(*(runner.decode([1], [lane, lane], p, 8, 32) for p in payloads),
                                       return_exceptions=True)
        assert isinstance(results[1], ValueError)
        assert [[t for x in results[i] for t in x] for i in (0, 2)] == [segments[0], segments[2]]  # type: ignore[union-attr]
        assert runner.live_jobs() == 0
        await _until(lambda: runner.live_rows() == 0)

    try:
        asyncio.run(main())
    finally:
        runner.close()


def test_cancelling_a_running_decode_frees_its_rows_and_others_still_decode(monkeypatch: pytest.MonkeyPatch
                                                                            ) -> None:
    gate = _Gate()
    gate.on_decoder(monkeypatch)
    lane = 60
    runner = _fast(max_rows=8)
    segments = _segments(2, 2, lane, seed=90)

    async def main() -> None:
        payloads = await _encode_all(runner, segments, lane)
        doomed = asyncio.ensure_future(runner.decode([1], [lane, lane], payloads[0], 8, 32))
        await _until(gate.reached.is_set)
        assert runner.live_rows() == 2
        doomed.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await doomed
        gate.release.set()
        await _until(lambda: runner.live_jobs() == 0 and runner.live_rows() == 0)
        back = await runner.decode([1], [lane, lane], payloads[1], 8, 32)
        assert [t for x in back for t in x] == segments[1]

    try:
        asyncio.run(main())
    finally:
        gate.release.set()
        runner.close()
