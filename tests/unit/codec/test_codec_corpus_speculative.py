"""The golden corpus (tests/fixtures/codec_v1, written by release ddd10e1) decodes byte for byte through
the pipeline with speculative decoding on — and with it off — in process, without an engine: the
exact runner over the default model (the HTTP check is tests/integration/test_codec_corpus.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from cascade.codec.exact.model import ExactLlama
from cascade.codec.exact.runner import ExactRunner
from cascade.codec.pipeline import CodecPipeline
from cascade.engine.fingerprint import model_fingerprint

from tests.unit.codec.numerics_matrix import PYCODER

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "codec_v1"
MANIFEST: dict[str, Any] = json.loads((CORPUS / "manifest.json").read_text())


@pytest.mark.parametrize("max_draft", [16, 0], ids=["speculative", "plain"])
def test_every_release_container_decodes_byte_for_byte_with_and_without_speculation(max_draft: int) -> None:
    from transformers import AutoTokenizer

    model = ExactLlama.from_pretrained(str(PYCODER), 1024)
    runner = ExactRunner(model, model.config.vocab_size, max_draft=max_draft)
    pipe = CodecPipeline(max_positions=1024, window=4)
    pipe.attach(runner, "exact-llama-1", AutoTokenizer.from_pretrained(str(PYCODER)), model_fingerprint(str(PYCODER)))

    async def decode(container: bytes) -> bytes:
        async def once() -> AsyncIterator[bytes]:
            yield container

        return b"".join([data async for _, data in pipe.decompress(once(), "corpus")])

    try:
        for name in sorted(MANIFEST["containers"]):
            container = (CORPUS / "containers" / f"{name}.cz").read_bytes()
            original = (CORPUS / "containers" / f"{name}.orig").read_bytes()
            assert asyncio.run(decode(container)) == original, name
        assert (runner.stats.drafted_tokens > 0) == (max_draft > 0)
        assert runner.stats.decode_steps < runner.stats.decoded_tokens or max_draft == 0
    finally:
        runner.close()
