"""Static-text proposer core: cursor, re-anchoring, counters (no engine)."""

from __future__ import annotations

from collections.abc import Sequence

from cascade.predict.aligner import LineAligner
from cascade.predict.simulator import simulate
from cascade.predict.static_text import PredictionState, normalise_newlines, split_lines
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.predict.toy_tokens import CODE, ToyTokenizer


class CountingAligner(LineAligner):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def align(self, context_lines: Sequence[tuple[int, ...]],
              prediction_lines: Sequence[tuple[int, ...]]) -> int | None:
        self.calls += 1
        return super().align(context_lines, prediction_lines)


def _pair(target_text: str, prediction_text: str) -> tuple[list[int], list[int], frozenset[int]]:
    tok = ToyTokenizer()
    target = tok.encode(target_text)
    prediction = tok.encode(normalise_newlines(prediction_text))
    return target, prediction, tok.newline_ids()


def test_empty_prediction_proposes_nothing() -> None:
    state = PredictionState([], frozenset({0}))
    state.observe([5])
    assert state.propose(8) == []


def test_unrelated_prediction_matches_nothing() -> None:
    target, prediction, nl = _pair(CODE, "zebra quartz\nvortex\n" * 3)
    result = simulate(target, prediction, nl, k=8)
    assert result.accepted == 0
    assert result.tokens == target


def test_exact_prediction_is_accepted_whole() -> None:
    target, prediction, nl = _pair(CODE, CODE)
    result = simulate(target, prediction, nl, k=8)
    assert result.tokens == target
    assert result.rejected == 0 and result.accepted >= len(target) - result.steps
    assert result.steps <= len(target) // 9 + 2
    assert result.rejected == 0


def test_cursor_advances_on_match_and_is_lost_on_mismatch() -> None:
    state = PredictionState([1, 2, 3, 4, 5], frozenset({9}))
    state.observe([1])
    assert state.cursor == 1 and state.propose(2) == [2, 3]
    state.observe([2, 3, 4])
    assert state.cursor == 4
    state.observe([7])
    assert state.cursor == -1 and state.propose(3) == []


def test_alignment_runs_only_when_a_line_completes() -> None:
    tok = ToyTokenizer()
    prediction = tok.encode(CODE)
    nl = tok.newline_ids()
    aligner = CountingAligner()
    state = PredictionState(prediction, nl, aligner=aligner)
    state.observe(tok.encode("bogus"))
    assert state.cursor == -1
    for word in ("more", " ", "words", " ", "here"):
        state.observe(tok.encode(word))
    assert aligner.calls == 0
    state.observe(tok.encode("\n"))
    assert aligner.calls == 1
    state.observe(tok.encode("x"))
    assert aligner.calls == 1


def test_inserted_line_reanchors_at_the_next_predicted_line() -> None:
    target_text = CODE.replace("        data = handle.read()\n", "        data = handle.read()\n        log(data)\n")
    target, prediction, nl = _pair(target_text, CODE)
    smart = simulate(target, prediction, nl, k=8)
    prefix = simulate(target, prediction, nl, k=8, mode="prefix")
    assert smart.tokens == target == prefix.tokens
    after_edit = len(target) - len(ToyTokenizer().encode(target_text.split("log(data)")[0]))
    assert smart.accepted > prefix.accepted + 0.8 * (after_edit - 20)


def test_removed_lines_reanchor() -> None:
    target_text = CODE.replace("    items = []\n", "")
    target, prediction, nl = _pair(target_text, CODE)
    smart = simulate(target, prediction, nl, k=8)
    prefix = simulate(target, prediction, nl, k=8, mode="prefix")
    assert smart.accepted > prefix.accepted + 30


def test_renamed_variable_recovers_on_unchanged_lines() -> None:
    target_text = CODE.replace("items", "entries")
    target, prediction, nl = _pair(target_text, CODE)
    smart = simulate(target, prediction, nl, k=8)
    prefix = simulate(target, prediction, nl, k=8, mode="prefix")
    assert smart.accepted > prefix.accepted + 15


def test_extracted_helper_reanchors_after_the_new_function() -> None:
    helper = "def strip_all(lines):\n    return [l.strip() for l in lines]\n\n"
    target_text = CODE.replace("def parse(data):", helper + "def parse(data):")
    target, prediction, nl = _pair(target_text, CODE)
    smart = simulate(target, prediction, nl, k=8)
    assert smart.tokens == target
    tail = ToyTokenizer().encode(CODE.split("def parse(data):")[1])
    assert smart.accepted >= 0.8 * len(tail)


def test_crlf_prediction_matches_lf_output() -> None:
    target, prediction, nl = _pair(CODE, CODE.replace("\n", "\r\n"))
    result = simulate(target, prediction, nl, k=8)
    assert result.rejected == 0 and result.accepted >= len(target) - result.steps


def test_partial_line_must_match_before_reanchoring() -> None:
    tok = ToyTokenizer()
    prediction = tok.encode("alpha\nbeta gamma\ndelta\n")
    nl = tok.newline_ids()
    state = PredictionState(prediction, nl)
    state.observe(tok.encode("zzz"))
    state.observe(tok.encode("\n") + tok.encode("beta"))
    assert state.cursor == -1 or prediction[state.cursor - 1] == tok.id("beta")


def test_prefix_mode_never_reanchors() -> None:
    target_text = CODE.replace("def load(path):", "def load(p):")
    target, prediction, nl = _pair(target_text, CODE)
    result = simulate(target, prediction, nl, k=8, mode="prefix")
    assert result.accepted <= 3


def test_split_lines_keeps_newline_tokens_with_their_line() -> None:
    lines, starts = split_lines([1, 2, 9, 3, 9, 4], frozenset({9}))
    assert lines == [(1, 2, 9), (3, 9), (4,)]
    assert starts == [0, 3, 5]


words = st.sampled_from(["a", "b", "c", " ", "\n", "d:\n", "(", ")"])


@settings(max_examples=150, deadline=None)
@given(st.lists(words, max_size=60), st.lists(words, max_size=60), st.integers(1, 10),
       st.sampled_from(["smart", "prefix"]))
def test_simulator_always_reproduces_target_and_counts_consistently(target_words: list[str],
                                                                    prediction_words: list[str], k: int,
                                                                    mode: str) -> None:
    tok = ToyTokenizer()
    target = [tok.id(w) for w in target_words]
    prediction = [tok.id(w) for w in prediction_words]
    result = simulate(target, prediction, tok.newline_ids(), k=k, mode=mode)  # type: ignore[arg-type]
    assert result.tokens == target
    assert result.accepted == sum(result.accepted_per_step)
    assert result.accepted + result.rejected == result.proposed
    assert result.accepted <= len(target)
