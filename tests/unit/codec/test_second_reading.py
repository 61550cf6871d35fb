"""The model computes with the correctly rounded square root; earlier releases computed with torch's
(MKL's, another variant on some machines). A segment that fails its checksum is read once more with
this machine's torch root, so what an earlier release wrote here keeps decoding here byte for byte.

No real container is known whose segment differs between the two roots (about one token in 2**29),
so the tests make the difference large: the model's root is perturbed, and the container is written
by a pipeline computing with the machine root, as an earlier release did."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest
import torch
from cascade.codec.exact import root
from cascade.codec.exact.model import NUMERICS_VERSION
from cascade.codec.exact.runner import ExactRunner
from cascade.codec.pipeline import CodecPipeline, CompressOptions, CompressStats, IntegrityError
from cascade.engine.fingerprint import model_fingerprint
from transformers import AutoTokenizer

from tests.unit.codec.numerics_matrix import PYCODER, pycoder

TEXT = (b"def read_config(path):\n    result = {}\n    with open(path) as handle:\n"
        b"        for line in handle:\n            key, _, value = line.partition('=')\n")


@pytest.fixture(scope="module")
def runners() -> Iterator[dict[str, ExactRunner]]:
    model = pycoder()
    made = {"model's root": ExactRunner(model, model.config.vocab_size),
            "machine root": ExactRunner(model, model.config.vocab_size, threads=1, machine_root=True)}
    yield made
    for runner in made.values():
        runner.close()


def _pipeline(runner: ExactRunner, second: ExactRunner | None) -> CodecPipeline:
    pipe = CodecPipeline(1024, 4)
    pipe.attach(runner, NUMERICS_VERSION, AutoTokenizer.from_pretrained(str(PYCODER)),
                model_fingerprint(str(PYCODER)), second_reader=None if second is None else lambda: second)
    return pipe


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


def _compress(pipe: CodecPipeline) -> bytes:
    async def run() -> bytes:
        options = CompressOptions(top_k=64, precision_bits=32, lane_tokens=24, lanes=2)
        return b"".join([part async for part in pipe.compress(_once(TEXT), options, CompressStats(), "t")])

    return asyncio.run(run())


def _decompress(pipe: CodecPipeline, container: bytes) -> bytes:
    async def run() -> bytes:
        return b"".join([data async for _, data in pipe.decompress(_once(container), "t")])

    return asyncio.run(run())


def _perturbed(squares: Any) -> Any:
    """A root no machine takes, for tensors and for the compiled kernels' arrays alike."""
    return (np.sqrt(squares) if isinstance(squares, np.ndarray) else torch.sqrt(squares)) * (1 + 2**-12)


def test_a_container_written_with_the_machine_root_is_read_again_with_it(
        runners: dict[str, ExactRunner], monkeypatch: pytest.MonkeyPatch) -> None:
    earlier_release = _compress(_pipeline(runners["machine root"], None))
    monkeypatch.setattr(root, "machine_is_correctly_rounded", lambda: False)
    monkeypatch.setattr(root, "correctly_rounded_root", _perturbed)
    with pytest.raises(IntegrityError):  # the model's (here: perturbed) root alone cannot read it
        _decompress(_pipeline(runners["model's root"], None), earlier_release)
    assert _decompress(_pipeline(runners["model's root"], runners["machine root"]), earlier_release) == TEXT


def test_a_segment_neither_root_reads_fails_with_the_first_readings_error(
        runners: dict[str, ExactRunner], monkeypatch: pytest.MonkeyPatch) -> None:
    container = _compress(_pipeline(runners["model's root"], None))
    monkeypatch.setattr(root, "machine_is_correctly_rounded", lambda: False)
    monkeypatch.setattr(root, "correctly_rounded_root", _perturbed)
    monkeypatch.setattr(root, "machine_root", lambda squares: torch.sqrt(squares) * (1 - 2**-12))
    with pytest.raises(IntegrityError, match=r"checksum|payload"):
        _decompress(_pipeline(runners["model's root"], runners["machine root"]), container)


def test_no_second_reader_is_made_where_the_machine_root_is_the_correctly_rounded_one(
        runners: dict[str, ExactRunner], monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[int] = []
    pipe = CodecPipeline(1024, 4)
    pipe.attach(runners["model's root"], NUMERICS_VERSION, AutoTokenizer.from_pretrained(str(PYCODER)),
                model_fingerprint(str(PYCODER)), second_reader=lambda: made.append(1) or runners["machine root"])
    container = _compress(pipe)
    monkeypatch.setattr(root, "machine_is_correctly_rounded", lambda: True)
    monkeypatch.setattr(root, "correctly_rounded_root", _perturbed)
    with pytest.raises(IntegrityError):
        _decompress(pipe, container)
    assert not made
