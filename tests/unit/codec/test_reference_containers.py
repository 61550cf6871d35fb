"""The start-up known answers for both container versions: a server writing either version makes the
reference machine's bytes for the sample and reads the other version's reference back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from cascade.codec.container import READ_VERSIONS
from cascade.codec.exact.model import NUMERICS_VERSION
from cascade.codec.exact.runner import ExactRunner
from cascade.codec.pipeline import (
    REFERENCE_CONTAINERS,
    SELF_TEST_TEXT,
    CodecPipeline,
    CompressOptions,
    CompressStats,
    IntegrityError,
)
from cascade.engine.fingerprint import model_fingerprint
from transformers import AutoTokenizer

from tests.unit.codec.numerics_matrix import PYCODER, pycoder


@pytest.fixture(scope="module")
def runner() -> Iterator[ExactRunner]:
    model = pycoder()
    runner = ExactRunner(model, model.config.vocab_size)
    yield runner
    runner.close()


def _pipeline(runner: ExactRunner, version: int) -> CodecPipeline:
    pipe = CodecPipeline(1024, 4, write_version=version)
    pipe.attach(runner, NUMERICS_VERSION, AutoTokenizer.from_pretrained(str(PYCODER)), model_fingerprint(str(PYCODER)))
    return pipe


async def _sample(pipe: CodecPipeline) -> bytes:
    async def source() -> AsyncIterator[bytes]:
        yield SELF_TEST_TEXT.encode()

    options = CompressOptions(top_k=64, precision_bits=32, lane_tokens=48, lanes=4)
    return b"".join([part async for part in pipe.compress(source(), options, CompressStats(), "t")])


@pytest.mark.parametrize("version", READ_VERSIONS)
def test_a_server_writing_either_version_makes_the_reference_bytes_and_passes_its_self_test(
        runner: ExactRunner, version: int) -> None:
    pipe = _pipeline(runner, version)
    container = asyncio.run(_sample(pipe))
    assert container[4] == version
    assert container == REFERENCE_CONTAINERS[version].read_bytes()
    asyncio.run(pipe.self_test())


def test_the_self_test_fails_when_the_other_versions_reference_does_not_decode(
        runner: ExactRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    damaged = bytearray(REFERENCE_CONTAINERS[3].read_bytes())
    damaged[-40] ^= 0x10
    fake = tmp_path / "reference.cz"
    fake.write_bytes(bytes(damaged))
    monkeypatch.setitem(REFERENCE_CONTAINERS, 3, fake)
    with pytest.raises((IntegrityError, ValueError)):
        asyncio.run(_pipeline(runner, 4).self_test())


def test_a_pipeline_refuses_to_write_a_version_no_reader_reads() -> None:
    with pytest.raises(ValueError, match="version"):
        CodecPipeline(1024, 4, write_version=5)
