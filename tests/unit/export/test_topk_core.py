"""The export's pure core: renormalisation, position assembly, token table, binary layout."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from cascade.export.token_table import build_token_table
from cascade.export.topk import (
    position_from_logprobs,
    positions_from_flat,
    positions_from_prompt_logprobs,
    renormalise,
)
from cascade_client.topk_document import iter_documents, read_all
from cascade_common.topk_format import (
    PAD_ID,
    TopkFormatError,
    encode_document,
    encode_header,
    read_header,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.logprob_layouts import Flat, Lp

MODEL = Path(__file__).resolve().parents[3] / "models" / "pycoder-23m"


candidates = st.lists(st.tuples(st.integers(0, 5000), st.floats(-60, 0)), min_size=1, max_size=60,
                      unique_by=lambda c: c[0])


@given(candidates, st.integers(1, 80))
def test_renormalised_probabilities_sum_to_one(cands: list[tuple[int, float]], k: int) -> None:
    ids, lps = renormalise(cands, k)
    assert len(ids) == min(k, len(cands))
    assert math.isclose(math.fsum(math.exp(lp) for lp in lps), 1.0, abs_tol=1e-9)


@given(candidates, st.integers(1, 80))
def test_renormalise_keeps_the_most_likely_in_canonical_order(cands: list[tuple[int, float]], k: int) -> None:
    ids, lps = renormalise(cands, k)
    expected = sorted(cands, key=lambda c: (-c[1], c[0]))[:k]
    assert list(ids) == [t for t, _ in expected]
    assert list(lps) == sorted(lps, reverse=True)


def test_renormalise_drops_masked_candidates() -> None:
    ids, lps = renormalise([(3, -0.1), (4, float("-inf")), (5, -2.0)], 10)
    assert ids == (3, 5)
    assert math.isclose(math.exp(lps[0]) + math.exp(lps[1]), 1.0)


def test_position_reports_target_outside_the_kept_set_as_none() -> None:
    scored = {7: Lp(-0.01, 1), 8: Lp(-5.0, 2), 9: Lp(float("-inf"), 900)}
    inside = position_from_logprobs(3, 8, scored, 2)
    assert inside.target_logprob is not None and inside.target_rank == 2
    masked = position_from_logprobs(3, 9, scored, 2)
    assert masked.target_logprob is None and masked.target_rank is None
    cut = position_from_logprobs(3, 8, scored, 1)
    assert cut.target_logprob is None and cut.ids == (7,)


def test_positions_skip_the_first_token_and_need_every_other() -> None:
    prompt = [5, 6, 7]
    scored = [None, {6: Lp(-0.5, 1), 1: Lp(-1.0, 2)}, {7: Lp(-0.2, 1)}]
    positions = positions_from_prompt_logprobs(prompt, scored, 4)
    assert [p.index for p in positions] == [1, 2] and [p.target for p in positions] == [6, 7]
    with pytest.raises(ValueError, match="position 2"):
        positions_from_prompt_logprobs(prompt, scored[:2], 4)


@st.composite
def engine_rows(draw: st.DrawFn) -> tuple[list[int], Flat, int]:
    """A prompt and what the engine returns for it: sorted top-k (ties and -inf included), target first."""
    k = draw(st.integers(1, 12))
    length = draw(st.integers(2, 12))
    prompt = draw(st.lists(st.integers(0, 40), min_size=length, max_size=length))
    flat = Flat()
    flat.append(None)
    level = st.sampled_from([-0.5, -1.0, -2.0, -math.inf]) | st.floats(-30, 0)
    for target in prompt[1:]:
        top = sorted(zip(draw(st.lists(st.integers(0, 40), min_size=k, max_size=k, unique=True)),
                         draw(st.lists(level, min_size=k, max_size=k)), strict=True), key=lambda c: -c[1])
        in_top = {t: (v, r) for r, (t, v) in enumerate(top, start=1)}
        value, rank = in_top.get(target, (draw(level), k + draw(st.integers(1, 50))))
        flat.append([(target, value, rank), *((t, v, r) for r, (t, v) in enumerate(top, start=1))])
    return prompt, flat, k


@settings(max_examples=300, deadline=None)
@given(engine_rows())
def test_flat_layout_gives_the_same_positions_as_the_per_position_path(case: tuple[list[int], Flat, int]) -> None:
    prompt, flat, k = case
    fast = positions_from_flat(prompt, flat, k)
    assert fast is not None
    slow = [position_from_logprobs(i, prompt[i], flat[i] or {}, k) for i in range(1, len(prompt))]
    for a, b in zip(fast, slow, strict=True):
        assert (a.index, a.target, a.target_rank, a.ids) == (b.index, b.target, b.target_rank, b.ids)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-12)
        assert (a.target_logprob is None) == (b.target_logprob is None)
        assert a.target_logprob == pytest.approx(b.target_logprob, abs=1e-12)


def test_flat_layout_with_another_shape_falls_back() -> None:
    flat = Flat()
    flat.append(None)
    flat.append([(5, -0.1, 1), (5, -0.1, 1)])
    assert positions_from_flat([1, 5], flat, k=2) is None
    assert positions_from_prompt_logprobs([1, 5], flat, k=2)[0].ids == (5,)  # type: ignore[arg-type]


def test_token_table_bytes_reassemble_the_text() -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    table = build_token_table(tokenizer)
    assert len(table) == len(tokenizer)
    text = "def naïve(x):\n\treturn x  # ✓ 🚀\r\n"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert b"".join(table.raw[i] for i in ids) == text.encode("utf-8")


def test_ids_past_the_tokenizer_render_as_empty_text() -> None:
    """Models pad their output vocabulary past the tokenizer (Qwen2: 151,936 rows, 151,665 tokens);
    a padded id the model ranks must render, not fail the export."""
    from transformers import AutoTokenizer

    table = build_token_table(AutoTokenizer.from_pretrained(MODEL))
    assert (table.string(len(table) + 5), table.data(len(table) + 5)) == ("", b"")
    assert table.data(10) == table.raw[10] and table.string(10) == table.strings[10]


class _SentencePieceVocabulary:
    """A Llama-2-style vocabulary: ``▁`` marks a space, ``<0xHH>`` byte fallback; decoding one token
    alone drops its leading space, as SentencePiece's decoder does."""

    pieces: ClassVar[list[str]] = ["<s>", "</s>", "<0x0A>", "\u2581the", "the", "\u2581", "é", "\u2581x"]
    all_special_ids: ClassVar[list[int]] = [0, 1]

    def __len__(self) -> int:
        return len(self.pieces)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self.pieces[i] for i in ids]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.pieces[i] for i in ids).replace("\u2581", " ").lstrip(" ")


def test_sentencepiece_tokens_keep_their_leading_space_and_fallback_bytes() -> None:
    table = build_token_table(_SentencePieceVocabulary())
    assert table.raw == (b"<s>", b"</s>", b"\n", b" the", b"the", b" ", "é".encode(), b" x")


def _document(k: int, rows: int) -> tuple[list[int], list[list[int]], list[list[float]]]:
    rng = np.random.default_rng(rows)
    targets = [int(t) for t in rng.integers(0, 8192, rows)]
    ids = [[int(t) for t in rng.choice(8192, size=int(rng.integers(1, k + 1)), replace=False)] for _ in range(rows)]
    lps = [sorted(rng.normal(-3, 1, len(r)).astype(np.float32).tolist(), reverse=True) for r in ids]
    return targets, ids, lps


@given(st.integers(1, 16), st.lists(st.integers(0, 20), max_size=4))
def test_binary_export_round_trips_through_its_reader(k: int, sizes: list[int]) -> None:
    blob = io.BytesIO()
    blob.write(encode_header(k, 8192))
    docs = []
    for n, size in enumerate(sizes):
        targets, ids, lps = _document(k, size)
        blob.write(encode_document(f"doc-{n}", 10 * n, k, targets, ids, lps))
        docs.append((targets, ids, lps))
    blob.seek(0)
    header, read = read_all(blob)
    assert header.k == k and header.vocab_size == 8192 and len(read) == len(sizes)
    for n, (doc, (targets, ids, lps)) in enumerate(zip(read, docs, strict=True)):
        assert doc.name == f"doc-{n}" and doc.start == 10 * n and len(doc) == len(targets)
        assert doc.targets.tolist() == targets
        for row, (row_ids, row_lps) in enumerate(zip(ids, lps, strict=True)):
            assert doc.ids[row, : len(row_ids)].tolist() == row_ids
            assert (doc.ids[row, len(row_ids):] == PAD_ID).all()
            assert doc.logprobs[row, : len(row_lps)].tolist() == row_lps
            assert np.isneginf(doc.logprobs[row, len(row_lps):]).all()


def test_binary_reader_rejects_truncation_and_garbage() -> None:
    targets, ids, lps = _document(4, 3)
    data = encode_header(4, 8192) + encode_document("x", 1, 4, targets, ids, lps)
    for cut in range(1, len(data)):
        if cut == 16:
            continue
        with pytest.raises(TopkFormatError):
            read_all(io.BytesIO(data[:cut]))
    with pytest.raises(TopkFormatError, match="magic"):
        read_header(io.BytesIO(b"XXXX" + data[4:]))
    huge = (encode_header(4, 8192) + b"CTKD" + b"\x00\x00" + (2**40).to_bytes(8, "little")
            + (2**31).to_bytes(4, "little"))
    stream = io.BytesIO(huge)
    with pytest.raises(TopkFormatError, match="positions"):
        list(iter_documents(stream, read_header(stream)))
