"""OpenAI rendering pieces: log-probabilities JSON can carry, and a replay's text and finish reason."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from cascade.api.completion_render import (
    LOGPROB_FLOOR,
    TokenCharacters,
    logprob_entries,
    prompt_entries,
    render_logprobs,
    sampled_text,
)
from cascade.engine.types import Candidate, CompletionDelta, TokenLogprobs
from cascade.export.token_table import TokenTable

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


def render(tokenizer: object, ids: list[int], stops: list[str] | None = None, ignore_eos: bool = False,
           min_tokens: int = 0, prompt: list[int] | None = None) -> tuple[str, str]:
    text, finish, _ = sampled_text(prompt or [], ids, stops or [], ignore_eos, min_tokens, {EOS}, tokenizer)
    return text, finish


def ids_of(tokenizer: object, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))  # type: ignore[attr-defined]


def test_a_stopping_end_of_sequence_token_is_not_in_the_text(tokenizer: object) -> None:
    assert render(tokenizer, [*ids_of(tokenizer, "x = 1"), EOS]) == ("x = 1", "stop")
    assert render(tokenizer, [EOS]) == ("", "stop")


def test_under_ignore_eos_the_end_token_does_not_stop_and_shows_nothing(tokenizer: object) -> None:
    assert render(tokenizer, [*ids_of(tokenizer, "x"), EOS, *ids_of(tokenizer, " y")], ignore_eos=True) \
        == ("x y", "length")


def test_a_stop_token_id_ends_the_text_without_itself_even_under_ignore_eos(tokenizer: object) -> None:
    x, newline = ids_of(tokenizer, "x"), ids_of(tokenizer, "\n")[-1]
    for ignore_eos in (False, True):
        got = sampled_text([], [*x, newline, *x], [], ignore_eos, 0, {EOS}, tokenizer, stop_token_ids={newline})
        assert got == ("x", "stop", newline)
    assert sampled_text([], [*x, newline], [], False, 0, {EOS}, tokenizer) == ("x\n", "length", None)


def test_a_stop_sequence_the_last_token_completes_is_cut_off(tokenizer: object) -> None:
    ids = ids_of(tokenizer, "import sys\nimport")
    cut = next(i for i in range(1, len(ids) + 1) if "\n" in tokenizer.decode(ids[:i]))  # type: ignore[attr-defined]
    assert render(tokenizer, ids[:cut], ["\n"]) == ("import sys", "stop")


def test_with_include_stop_str_in_output_the_text_ends_where_the_stop_sequence_ends(tokenizer: object) -> None:
    ids = ids_of(tokenizer, "import sys\nimport os")
    assert sampled_text([], ids, ["sys"], False, 0, {EOS}, tokenizer, keep_stop=True) == ("import sys", "stop", "sys")
    assert sampled_text([], ids, ["s\ni"], False, 0, {EOS}, tokenizer, keep_stop=True) \
        == ("import sys\ni", "stop", "s\ni")


def test_no_stop_sequence_is_searched_for_within_min_tokens(tokenizer: object) -> None:
    ids = ids_of(tokenizer, "a\nb c d")
    first_newline = next(i for i in range(1, len(ids) + 1) if "\n" in tokenizer.decode(ids[:i]))  # type: ignore[attr-defined]
    text = tokenizer.decode(ids)  # type: ignore[attr-defined]
    assert render(tokenizer, ids, ["\n"], min_tokens=first_newline) == (text, "length")
    assert render(tokenizer, ids, ["\n"], min_tokens=first_newline - 1) == ("a", "stop")


def test_of_stop_sequences_one_token_completes_the_one_ending_first_wins(tokenizer: object) -> None:
    """vLLM's rule (the result of appending one character at a time); ties go by the request's order."""
    ids = ids_of(tokenizer, "xy")
    if len(ids) != 1:
        pytest.skip("needs 'xy' as one token")
    assert render(tokenizer, ids, ["y", "x"]) == ("", "stop")
    assert render(tokenizer, ids, ["xy", "x"]) == ("", "stop")
    assert render(tokenizer, ids, ["y"]) == ("x", "stop")


def test_a_character_split_across_tokens_appears_once_complete_and_can_stop(tokenizer: object) -> None:
    ids = ids_of(tokenizer, "a日本")
    pieces = [tokenizer.decode(ids[:i]) for i in range(1, len(ids) + 1)]  # type: ignore[attr-defined]
    if not any(p.endswith("\ufffd") for p in pieces):
        pytest.skip("needs a character split across byte tokens")
    split = next(i for i, p in enumerate(pieces, start=1) if p.endswith("\ufffd"))
    assert render(tokenizer, ids[:split]) == (pieces[split - 1].rstrip("\ufffd"), "length")
    assert render(tokenizer, ids, ["日"]) == ("a", "stop")
    assert render(tokenizer, ids) == ("a日本", "length")


def test_the_text_continues_the_prompt_as_the_engine_detokenizes_it(tokenizer: object) -> None:
    prompt = ids_of(tokenizer, "x =")
    ids = ids_of(tokenizer, " 1")
    assert render(tokenizer, ids, prompt=prompt) == (" 1", "length")


def test_tokens_holding_part_of_a_character_get_distinct_names_real_bytes_and_character_offsets() -> None:
    """As vLLM decodes them: a token starting a character is "", the one ending it the whole character."""
    table = TokenTable(("", "", "x", "a"), (b"\xe6\x97", b"\xa5", b"x", b"a"))  # "日" = e6 97 a5
    first = TokenLogprobs(3, "a", -0.1, (Candidate(3, "a", -0.1),))
    starting = TokenLogprobs(0, "", -0.1, (Candidate(0, "", -0.1), Candidate(1, "", -2.0), Candidate(2, "x", -3.0)))
    ending = TokenLogprobs(1, "日", -0.2, (Candidate(1, "日", -0.2), Candidate(2, "x", -2.5)))
    after = TokenLogprobs(2, "x", -0.3, (Candidate(2, "x", -0.3),))
    delta = CompletionDelta(0, "a日x", (3, 0, 1, 2), None, logprobs=(first, starting, ending, after))
    completion = render_logprobs("completion", logprob_entries(delta, 2, "completion", table), 0,
                                 TokenCharacters(table).count(delta, 2))
    assert completion["tokens"] == ["a", "bytes:\\xe6\\x97", "bytes:\\xa5", "x"]
    assert completion["top_logprobs"][1] == {"bytes:\\xe6\\x97": -0.1, "bytes:\\xa5": -2.0}
    assert completion["text_offset"] == [0, 1, 1, 2]
    chat = logprob_entries(delta, 2, "chat", table)
    assert b"".join(bytes(e["bytes"]) for e in chat).decode() == "a日x"


def test_the_engines_spelling_of_a_whole_token_is_kept() -> None:
    from cascade.export.token_table import TokenTable

    table = TokenTable(("Ġx",), (b" x",))
    delta = CompletionDelta(0, " x", (0,), None, logprobs=(TokenLogprobs(0, " x", -0.5, (Candidate(0, " x", -0.5),)),))
    entry = logprob_entries(delta, 1, "chat", table)[0]
    assert entry["token"] == " x" and entry["bytes"] == [32, ord("x")]


@pytest.mark.parametrize(("pieces", "text", "offsets"), [
    ([b"\xf0\x9f", b"\x98", b"\x80", b"y", b" =", b" 1"], "\U0001f600y = 1", [0, 0, 0, 1, 2, 4]),
    ([b"<s>", b"ab", b" c"], "ab c", [0, 0, 2]),
    ([b"x", b"\xc3", b"\xa9", b"!"], "x\u00e9!", [0, 1, 1, 2]),
    ([b" foo", b" bar"], "foo bar", [0, 3]),
])
def test_echoed_prompt_offsets_index_the_echoed_text(pieces: list[bytes], text: str, offsets: list[int]) -> None:
    """A token holding part of a character adds none of it, the one completing it adds it; a token the
    text does not show (a BOS) adds nothing; the characters add up to the text."""
    table = TokenTable(tuple(p.decode("utf-8", "replace") for p in pieces), tuple(pieces))
    prompt = list(range(len(pieces)))
    positions = [TokenLogprobs(t, "", -1.0, (Candidate(t, "", -1.0),)) for t in prompt[1:]]
    entries, characters = prompt_entries(prompt, text, positions, 1, table)
    assert sum(characters) == len(text)
    rendered = render_logprobs("completion", entries, 0, characters)
    assert rendered["text_offset"] == offsets
    assert rendered["token_logprobs"][0] is None and rendered["top_logprobs"][0] is None


def test_a_generated_character_split_over_tokens_is_offset_as_an_echoed_one_is() -> None:
    """The engine spells `` \xf0\x9f\x98`` + ``\x8f`` as ``""`` + ``" 😏"``: the space and the emoji both on the
    second token. Offsets count as the echo path does: the space at the first token, the emoji at the token
    completing it, so the second token starts at the emoji (1), not at the space (0)."""
    raw = (b"x", b" \xf0\x9f\x98", b"\x8f", b"\xf0\x9f", b"!")
    table = TokenTable(tuple(r.decode("utf-8", "replace") for r in raw), raw)
    spelled = [(0, "x"), (1, ""), (2, " \U0001f60f"), (3, ""), (4, "\ufffd!")]
    positions = [TokenLogprobs(t, text, -1.0, (Candidate(t, text, -1.0),)) for t, text in spelled]
    counter = TokenCharacters(table)
    counts = [n for position in positions  # one delta per token, as a stream delivers them: state carries
              for n in counter.count(CompletionDelta(0, position.token, (position.token_id,), None,
                                                     logprobs=(position,)), 0)]
    assert counts == [1, 1, 1, 0, 2]
    offsets = render_logprobs("completion", [{"token": "t", "logprob": -1.0, "top_logprobs": None}] * 5,
                              0, counts)["text_offset"]
    assert offsets == [0, 1, 2, 3, 3]
    assert sum(counts) == sum(len(text) for _, text in spelled)
    assert TokenCharacters(None).count(CompletionDelta(0, "", (1,), None, logprobs=(positions[1],)), 0) == [0]


def test_the_stop_reason_names_the_stop_sequence_that_ended_the_text_and_none_for_the_end_token(
        tokenizer: object) -> None:
    ids = ids_of(tokenizer, "import sys\nimport os")
    assert sampled_text([], ids, ["os", "\n"], False, 0, {EOS}, tokenizer).stop_reason == "\n"
    assert sampled_text([], [*ids, EOS], [], False, 0, {EOS}, tokenizer).stop_reason is None
