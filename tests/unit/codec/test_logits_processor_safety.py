"""The codec logits processor runs inside the engine process: it must never raise there."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from cascade.codec import vllm_logits_processor as lp  # noqa: E402
from cascade.codec.params import CodecArgs  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdate  # noqa: E402

VOCAB = 50


def _processor() -> lp.CodecLogitsProcessor:
    config = SimpleNamespace(model_config=SimpleNamespace(get_vocab_size=lambda: VOCAB))
    return lp.CodecLogitsProcessor(config, torch.device("cpu"), False)


def _add(processor: lp.CodecLogitsProcessor, rows: list[CodecArgs | None]) -> list[list[int]]:
    outputs: list[list[int]] = [[] for _ in rows]
    added = [(i, SimpleNamespace(extra_args=args.to_extra_args() if args else None), [], outputs[i])
             for i, args in enumerate(rows)]
    processor.update_state(BatchUpdate(batch_size=len(rows), removed=[], added=added, moved=[]))
    return outputs


def test_an_undecodable_row_is_forced_to_a_fixed_token_instead_of_raising(monkeypatch: pytest.MonkeyPatch) -> None:
    processor = _processor()
    _add(processor, [CodecArgs("decode", top_k=4, payload_b64="AAAA"), CodecArgs("force", tokens=[7, 8]), None])
    assert processor.live_rows() == 2

    def broken(*args: object) -> int:
        raise ZeroDivisionError("hostile payload")

    monkeypatch.setattr(lp, "decode_next_token", broken)
    logits = torch.zeros(3, VOCAB)
    out = processor.apply(logits)
    assert int(out[0].argmax()) == 0 and processor.rows[0].failed
    assert int(out[1].argmax()) == 7  # the other codec row is untouched
    assert torch.all(out[2] == 0)  # rows without codec args are untouched


def test_a_forced_token_outside_the_logits_is_not_written(monkeypatch: pytest.MonkeyPatch) -> None:
    processor = _processor()
    _add(processor, [CodecArgs("force", tokens=[VOCAB + 10])])
    out = processor.apply(torch.zeros(1, VOCAB))
    assert int(out[0].argmax()) == 0 and processor.rows[0].failed


def test_removed_rows_release_their_state() -> None:
    processor = _processor()
    _add(processor, [CodecArgs("force", tokens=[1]), CodecArgs("force", tokens=[2])])
    processor.update_state(BatchUpdate(batch_size=0, removed=[0, 1], added=[], moved=[]))
    assert processor.live_rows() == 0
