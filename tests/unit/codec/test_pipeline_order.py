"""The pipeline with several segments in flight: records and their running CRC follow submission order.

A byte-level stand-in replaces the exact runner so segments can be made to finish in reverse order;
the container, not the model, is what is under test here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from cascade.codec.container import parse_container
from cascade.codec.exact.runner import EncodedSegment
from cascade.codec.pipeline import CodecPipeline, CompressOptions, CompressStats
from cascade_common.ordered import ordered


class ByteTokenizer:
    eos_token_id = 0

    def __len__(self) -> int:
        return 256

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, tokens: list[int], **_: Any) -> str:
        return bytes(tokens).decode("utf-8", "replace")


class ReverseFinishingRunner:
    """Stores each lane's tokens as bytes; later segments finish first."""

    vocab_size = 256

    def __init__(self) -> None:
        self.started = 0

    async def encode(self, prompt: Sequence[int], lanes: Sequence[Sequence[int]], top_k: int,
                     precision_bits: int, request: object = None, *, weighted_escapes: bool = True) -> EncodedSegment:
        self.started += 1
        await asyncio.sleep(0.05 / self.started)
        return EncodedSegment(b"".join(bytes(lane) for lane in lanes), sum(len(lane) for lane in lanes), 0.0)

    async def decode(self, prompt: Sequence[int], lengths: Sequence[int], payload: bytes, top_k: int,
                     precision_bits: int, request: object = None, *, weighted_escapes: bool = True) -> list[list[int]]:
        await asyncio.sleep(0)
        out, start = [], 0
        for n in lengths:
            out.append(list(payload[start:start + n]))
            start += n
        return out


def _pipeline(window: int) -> CodecPipeline:
    pipe = CodecPipeline(max_positions=64, window=window)
    pipe.attach(ReverseFinishingRunner(), "bytes-test", ByteTokenizer(), bytes(range(32)))  # type: ignore[arg-type]
    return pipe


async def _source(data: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(data), 100):
        yield data[i:i + 100]


async def _compress(pipe: CodecPipeline, data: bytes) -> bytes:
    options = CompressOptions(top_k=8, precision_bits=32, lane_tokens=20, lanes=2)
    return b"".join([part async for part in pipe.compress(_source(data), options, CompressStats(), "t")])


async def _decompress(pipe: CodecPipeline, container: bytes) -> bytes:
    async def once() -> AsyncIterator[bytes]:
        yield container

    return b"".join([data async for _, data in pipe.decompress(once(), "t")])


def test_segments_finishing_out_of_order_still_give_a_valid_trailer_crc() -> None:
    data = "".join(f"line {i}: {'é' * (i % 7)} the quick brown fox\n" for i in range(60)).encode()
    pipe = _pipeline(window=6)
    container = asyncio.run(_compress(pipe, data))
    parsed = parse_container(container)
    assert len(parsed.segments) > 6
    assert asyncio.run(_decompress(pipe, container)) == data


def test_window_does_not_change_the_container() -> None:
    data = "".join(f"def f{i}(x):\n    return x * {i}\n" for i in range(40)).encode()
    assert asyncio.run(_compress(_pipeline(window=1), data)) == asyncio.run(_compress(_pipeline(window=8), data))


def test_results_come_out_while_the_source_still_waits_for_input() -> None:
    """A streamed upload gets its first records back before it ends, whatever the window."""
    async def main() -> list[str]:
        seen: list[str] = []
        more = asyncio.Event()

        async def jobs() -> AsyncIterator[Callable[[], Awaitable[int]]]:
            for i in range(3):
                yield lambda i=i: asyncio.sleep(0, result=i)  # type: ignore[misc]
            await more.wait()
            yield lambda: asyncio.sleep(0, result=3)

        async for result in ordered(jobs(), window=8):
            seen.append(f"result {result}")
            if result == 2:
                seen.append("input resumes")
                more.set()
        return seen

    assert asyncio.run(main()) == ["result 0", "result 1", "result 2", "input resumes", "result 3"]


def _compress_planned(pipe: CodecPipeline, data: bytes, budget: int) -> bytes:
    options = CompressOptions(top_k=8, precision_bits=32, lane_tokens=40, lanes=4, step_budget=budget, extra_lanes=1)

    async def main() -> bytes:
        return b"".join([part async for part in pipe.compress(_source(data), options, CompressStats(), "t")])

    return asyncio.run(main())


def test_a_small_input_is_planned_as_one_segment_of_shorter_lanes_recorded_in_its_header() -> None:
    """70 tokens (bytes here) under a budget of 25 steps: one segment of lanes of 25 (25 + 25 + 20; the
    default plan, lanes of 40, would be 2 lanes: one extra lane allowed), header lane_tokens 25; a
    budget of 0 and an input larger than one default segment keep lanes of 40."""
    pipe = _pipeline(window=2)
    small = bytes(65 + i % 26 for i in range(70))
    planned = parse_container(_compress_planned(pipe, small, 25))
    assert planned.header.lane_tokens == 25 and len(planned.segments) == 1
    assert asyncio.run(_decompress(pipe, _compress_planned(pipe, small, 25))) == small
    assert parse_container(_compress_planned(pipe, small, 0)).header.lane_tokens == 40
    large = bytes(65 + i % 26 for i in range(1000))
    assert parse_container(_compress_planned(pipe, large, 25)).header.lane_tokens == 40
