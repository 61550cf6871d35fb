"""OpenAI rendering pieces: log-probabilities JSON can carry, and a replay's text and finish reason."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from cascade.api.completion_render import LOGPROB_FLOOR, logprob_entries, sampled_text
from cascade.engine.types import Candidate, CompletionDelta, TokenLogprobs

PYCODER = Path(__file__).resolve().parents[2] / "models" / "pycoder-23m"
EOS = 1


@pytest.fixture(scope="module")
def tokenizer() -> object:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(PYCODER))


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_candidates_a_constraint_ruled_out_get_openais_floor_not_infinity(kind: str) -> None:
    position = TokenLogprobs(7, "{", 0.0, (Candidate(7, "{", 0.0), Candidate(8, "x", -math.inf),
                                           Candidate(9, "y", -math.inf)))
    delta = CompletionDelta(0, "{", (7,), None, logprobs=(position,))
    entries = logprob_entries(delta, 3, kind)  # type: ignore[arg-type]
    json.dumps(entries, allow_nan=False)
    assert [t["logprob"] for t in entries[0]["top_logprobs"]][-2:] == [LOGPROB_FLOOR, LOGPROB_FLOOR]


def test_a_stopping_end_of_sequence_token_is_not_in_the_text(tokenizer: object) -> None:
    ids = [*tokenizer.encode("x = 1", add_special_tokens=False), EOS]  # type: ignore[attr-defined]
    assert sampled_text(ids, [], False, 0, {EOS}, tokenizer) == ("x = 1", "stop")
    assert sampled_text([EOS], [], False, 0, {EOS}, tokenizer) == ("", "stop")


def test_under_ignore_eos_or_before_min_tokens_the_end_token_does_not_stop(tokenizer: object) -> None:
    ids = [*tokenizer.encode("x", add_special_tokens=False), EOS]  # type: ignore[attr-defined]
    assert sampled_text(ids, [], True, 0, {EOS}, tokenizer) == ("x", "length")
    assert sampled_text(ids, [], False, len(ids) + 1, {EOS}, tokenizer)[1] == "length"


def test_a_stop_sequence_the_last_token_completes_is_cut_off(tokenizer: object) -> None:
    ids = tokenizer.encode("import sys\nimport", add_special_tokens=False)  # type: ignore[attr-defined]
    cut = next(i for i in range(1, len(ids) + 1) if "\n" in tokenizer.decode(ids[:i]))  # type: ignore[attr-defined]
    assert sampled_text(ids[:cut], ["\n"], False, 0, {EOS}, tokenizer) == ("import sys", "stop")


def test_a_stop_sequence_earlier_than_the_last_token_is_not_searched_for(tokenizer: object) -> None:
    """The engine would have stopped there: tokens after it are not a sampled generation, and a
    replay shows them as they decode (only the last token's new characters are searched)."""
    ids = tokenizer.encode("a\nb c d e", add_special_tokens=False)  # type: ignore[attr-defined]
    text = tokenizer.decode(ids)  # type: ignore[attr-defined]
    assert sampled_text(ids, ["\n"], False, 0, {EOS}, tokenizer) == (text, "length")


def test_stop_sequences_are_searched_in_the_requests_order(tokenizer: object) -> None:
    ids = tokenizer.encode("xy", add_special_tokens=False)  # type: ignore[attr-defined]
    if len(ids) != 1:
        pytest.skip("needs 'xy' as one token")
    assert sampled_text(ids, ["y", "x"], False, 0, {EOS}, tokenizer) == ("x", "stop")
    assert sampled_text(ids, ["x", "y"], False, 0, {EOS}, tokenizer) == ("", "stop")
