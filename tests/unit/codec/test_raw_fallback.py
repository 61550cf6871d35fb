"""Segments whose code would outgrow their bytes are stored raw: no input grows by more than the framing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from cascade.codec.container import KIND_CODED, KIND_RAW, parse_container
from cascade.codec.exact.runner import EncodedSegment
from cascade.codec.pipeline import CodecPipeline, CompressOptions, CompressStats, stored_raw_is_smaller

from tests.unit.codec.test_pipeline_order import ByteTokenizer


class ScalingRunner:
    """Codes each token as ``width`` bytes (1: a byte per byte, so never smaller than raw; 0.5 would be
    impossible, so ``width`` 0 codes every other token's byte: a code half the size)."""

    vocab_size = 256

    def __init__(self, width: int) -> None:
        self.width = width

    async def encode(self, prompt: Sequence[int], lanes: Sequence[Sequence[int]], top_k: int,
                     precision_bits: int, request: object = None, *, weighted_escapes: bool = True) -> EncodedSegment:
        flat = [t for lane in lanes for t in lane]
        payload = bytes(flat[::2]) if self.width == 0 else bytes(t for t in flat for _ in range(self.width))
        return EncodedSegment(payload, len(flat), 0.0)

    async def decode(self, prompt: Sequence[int], lengths: Sequence[int], payload: bytes, top_k: int,
                     precision_bits: int, request: object = None, *, weighted_escapes: bool = True) -> list[list[int]]:
        raise AssertionError("only coded segments are decoded by the runner")


def _compress(width: int, data: bytes) -> tuple[bytes, CompressStats]:
    pipe = CodecPipeline(max_positions=64, window=4)
    pipe.attach(ScalingRunner(width), "bytes-test", ByteTokenizer(), bytes(range(32)))  # type: ignore[arg-type]
    stats = CompressStats()

    async def source() -> AsyncIterator[bytes]:
        yield data

    async def main() -> bytes:
        options = CompressOptions(top_k=8, precision_bits=32, lane_tokens=20, lanes=2)
        return b"".join([part async for part in pipe.compress(source(), options, stats, "t")])

    return asyncio.run(main()), stats


def test_a_segment_whose_code_is_larger_than_its_bytes_is_stored_raw() -> None:
    data = b"\0" * 1000
    container, stats = _compress(3, data)
    parsed = parse_container(container)
    assert {s.kind for s in parsed.segments} == {KIND_RAW}
    assert b"".join(s.payload for s in parsed.segments) == data
    assert stats.raw_segments == stats.segments == len(parsed.segments)
    empty, _ = _compress(3, b"")
    per_segment = 1 + 2 + 4  # kind, varint length, record CRC
    assert len(container) <= len(data) + len(empty) + per_segment * len(parsed.segments)


def test_a_segment_whose_code_is_smaller_stays_coded() -> None:
    container, stats = _compress(0, b"abcdefgh" * 40)
    assert {s.kind for s in parse_container(container).segments} == {KIND_CODED}
    assert stats.raw_segments == 0


def test_raw_wins_exactly_when_its_record_is_shorter() -> None:
    original = b"x" * 100
    assert stored_raw_is_smaller(100, original, original)
    assert not stored_raw_is_smaller(100, original, b"y" * 80)
    assert stored_raw_is_smaller(100, original, b"y" * 95)
