"""Token bytes and re-encoding: the proposer's view of the real tokenizer follows text exactly."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
from cascade.predict.static_text import PredictionState
from cascade.predict.vocabulary import TokenizerVocabulary, char_boundary, text_of, token_pieces
from cascade.vllm_compat.proposer import tokenizer_vocabulary
from hypothesis import given, settings
from hypothesis import strategies as st

MODEL = Path(__file__).resolve().parents[3] / "models" / "pycoder-23m"


@cache
def vocabulary() -> TokenizerVocabulary:
    transformers = pytest.importorskip("transformers")
    return tokenizer_vocabulary(transformers.AutoTokenizer.from_pretrained(str(MODEL)))


def test_byte_level_spellings_become_their_bytes() -> None:
    assert token_pieces(["<s>", "a", "Ġdef", "Ċ", "Ã©"], special=[0]) == [b"", b"a", b" def", b"\n", "é".encode()]


def test_sentencepiece_spellings_become_their_bytes() -> None:
    assert token_pieces(["<s>", "▁def", "<0x0A>", "é", "ab"], special=[0]) == [b"", b" def", b"\n", "é".encode(), b"ab"]


def test_char_boundary_never_cuts_a_character() -> None:
    data = "aé".encode()
    assert [char_boundary(data, end) for end in range(5)] == [0, 1, 1, 3, 3]


texts = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=80)


@settings(max_examples=200, deadline=None)
@given(texts, st.integers(0, 400))
def test_any_suffix_of_any_text_is_spelled_exactly(text: str, cut: int) -> None:
    vocab = vocabulary()
    data = text.encode()
    assert text_of(vocab, vocab.encode(data)) == data
    suffix = data[min(cut, len(data)):]
    assert text_of(vocab, vocab.encode(suffix)) == suffix


def test_output_ending_inside_a_multibyte_character_is_followed() -> None:
    vocab = vocabulary()
    text = "naïve = 'é'\n".encode()
    cut = text.index("ï".encode()) + 1
    state = PredictionState(vocab.encode(text), vocab)
    state.observe([*vocab.encode(text[:cut - 1]), list(vocab.pieces).index(text[cut - 1:cut])])
    assert state.cursor == cut
    draft = state.propose(4)
    assert draft and text[cut:].startswith(text_of(vocab, draft))


def test_debug_snapshot_is_plain_yaml_even_inside_a_character() -> None:
    yaml = pytest.importorskip("yaml")
    vocab = vocabulary()
    text = "naïve\n".encode()
    state = PredictionState(vocab.encode(text), vocab)
    state.observe([*vocab.encode(text[:2]), list(vocab.pieces).index(text[2:3])])
    record = yaml.safe_load(yaml.safe_dump(state.snapshot()))
    assert record["cursor"] == 3 and record["tail"] == "na\ufffd" and record["source"] is None
