"""Static-text proposer core: text cursor, re-anchoring, re-tokenisation, counters (no engine)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cascade.predict.aligner import LineAligner
from cascade.predict.draft_length import AdaptiveLength, FixedLength
from cascade.predict.simulator import simulate
from cascade.predict.static_text import PredictionState, normalise_newlines, split_lines
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.predict.toy_tokens import CODE, ToyTokenizer


class CountingAligner(LineAligner):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def align(self, context_lines: Sequence[bytes], prediction_lines: Sequence[bytes], near: int = -1,
              fits: Callable[[int], bool] | None = None) -> int | None:
        self.calls += 1
        return super().align(context_lines, prediction_lines, near, fits)


def _pair(target_text: str, prediction_text: str) -> tuple[list[int], list[int], ToyTokenizer]:
    tok = ToyTokenizer()
    target = tok.encode_text(target_text)
    prediction = tok.encode_text(normalise_newlines(prediction_text))
    return target, prediction, tok


def test_empty_prediction_proposes_nothing() -> None:
    state = PredictionState([], ToyTokenizer())
    state.observe([])
    assert state.propose(8) == []


def test_unrelated_prediction_matches_nothing() -> None:
    target, prediction, tok = _pair(CODE, "zebra quartz\nvortex\n" * 3)
    result = simulate(target, prediction, tok, k=8)
    assert result.accepted == 0
    assert result.tokens == target


def test_exact_prediction_is_accepted_whole() -> None:
    target, prediction, tok = _pair(CODE, CODE)
    result = simulate(target, prediction, tok, k=8)
    assert result.tokens == target
    assert result.rejected == 0 and result.accepted >= len(target) - result.steps
    assert result.steps <= len(target) // 9 + 2


def test_cursor_advances_on_matching_text_and_is_lost_on_mismatch() -> None:
    tok = ToyTokenizer()
    state = PredictionState(tok.encode_text("a b c d"), tok)
    state.observe(tok.encode_text("a"))
    assert state.cursor == 1 and state.propose(2) == tok.encode_text(" b")
    state.observe(tok.encode_text(" b "))
    assert state.cursor == 4
    state.observe(tok.encode_text("x"))
    assert state.cursor == -1 and state.propose(3) == []


def test_alignment_runs_only_when_a_line_completes() -> None:
    tok = ToyTokenizer()
    prediction = tok.encode_text(CODE)
    aligner = CountingAligner()
    state = PredictionState(prediction, tok, aligner=aligner)
    state.observe(tok.encode_text("bogus"))
    assert state.cursor == -1
    for word in ("more", " ", "words", " ", "here"):
        state.observe(tok.encode_text(word))
    assert aligner.calls == 0
    state.observe(tok.encode_text("\n"))
    assert aligner.calls == 1
    state.observe(tok.encode_text("x"))
    assert aligner.calls == 1


def test_inserted_line_reanchors_at_the_next_predicted_line() -> None:
    target_text = CODE.replace("        data = handle.read()\n", "        data = handle.read()\n        log(data)\n")
    target, prediction, tok = _pair(target_text, CODE)
    smart = simulate(target, prediction, tok, k=8)
    prefix = simulate(target, prediction, tok, k=8, mode="prefix")
    assert smart.tokens == target == prefix.tokens
    after_edit = len(target) - len(tok.encode_text(target_text.split("log(data)")[0]))
    assert smart.accepted > prefix.accepted + 0.8 * (after_edit - 20)


def test_removed_lines_reanchor() -> None:
    target, prediction, tok = _pair(CODE.replace("    items = []\n", ""), CODE)
    smart = simulate(target, prediction, tok, k=8)
    prefix = simulate(target, prediction, tok, k=8, mode="prefix")
    assert smart.accepted > prefix.accepted + 30


def test_renamed_variable_recovers_on_unchanged_lines() -> None:
    target, prediction, tok = _pair(CODE.replace("items", "entries"), CODE)
    smart = simulate(target, prediction, tok, k=8)
    prefix = simulate(target, prediction, tok, k=8, mode="prefix")
    assert smart.accepted > prefix.accepted + 15


def test_extracted_helper_reanchors_after_the_new_function() -> None:
    helper = "def strip_all(lines):\n    return [l.strip() for l in lines]\n\n"
    target, prediction, tok = _pair(CODE.replace("def parse(data):", helper + "def parse(data):"), CODE)
    smart = simulate(target, prediction, tok, k=8)
    assert smart.tokens == target
    tail = tok.encode_text(CODE.split("def parse(data):")[1])
    assert smart.accepted >= 0.8 * len(tail)


def test_crlf_prediction_matches_lf_output() -> None:
    target, prediction, tok = _pair(CODE, CODE.replace("\n", "\r\n"))
    result = simulate(target, prediction, tok, k=8)
    assert result.rejected == 0 and result.accepted >= len(target) - result.steps


def test_partial_line_must_match_before_reanchoring() -> None:
    tok = ToyTokenizer()
    prediction = "alpha\nbeta gamma\ndelta\n"
    state = PredictionState(tok.encode_text(prediction), tok)
    state.observe(tok.encode_text("zzz"))
    state.observe(tok.encode_text("\nbeta"))
    assert state.cursor == -1 or prediction.encode()[:state.cursor].endswith(b"beta")


def test_prefix_mode_never_reanchors() -> None:
    target, prediction, tok = _pair(CODE.replace("def load(path):", "def load(p):"), CODE)
    result = simulate(target, prediction, tok, k=8, mode="prefix")
    assert result.accepted <= 3


def test_split_lines_keeps_newlines_with_their_line() -> None:
    lines, starts = split_lines(b"ab\nc\nd")
    assert lines == [b"ab\n", b"c\n", b"d"]
    assert starts == [0, 3, 5]


def test_same_text_with_other_token_boundaries_keeps_being_accepted() -> None:
    tok = ToyTokenizer()
    target = tok.split(CODE, "handle")
    prediction = tok.encode_text(CODE)
    assert target != prediction
    for mode in ("smart", "prefix"):
        result = simulate(target, prediction, tok, k=8, mode=mode)  # type: ignore[arg-type]
        assert result.tokens == target
        assert result.state is not None and result.state.cursor == len(CODE.encode())
        assert result.accepted >= len(target) - result.steps - CODE.count("handle")
        assert result.state.retokenised >= CODE.count("handle")


words = st.sampled_from(["a", "b", "c", " ", "\n", "d:\n", "(", ")"])


@settings(max_examples=150, deadline=None)
@given(st.lists(words, max_size=60), st.lists(words, max_size=60), st.integers(1, 10),
       st.sampled_from(["smart", "prefix"]), st.booleans())
def test_simulator_always_reproduces_target_and_counts_consistently(target_words: list[str],
                                                                    prediction_words: list[str], k: int,
                                                                    mode: str, adaptive: bool) -> None:
    tok = ToyTokenizer()
    target = [tok.id(w) for w in target_words]
    prediction = [tok.id(w) for w in prediction_words]
    lengths = AdaptiveLength(k) if adaptive else FixedLength(k)
    result = simulate(target, prediction, tok, k=k, mode=mode, lengths=lengths)  # type: ignore[arg-type]
    assert result.tokens == target
    assert result.accepted == sum(result.accepted_per_step)
    assert result.accepted + result.rejected == result.proposed
    assert result.accepted <= len(target)
    assert max(result.drafted_per_step, default=0) <= k


identifiers = st.sampled_from(["items", "data", "xs", "handle", "parse_all", "é_t"])
code_words = st.lists(st.one_of(identifiers, st.sampled_from([" ", "\n", "(", "):\n", " = ", "    "])),
                      min_size=1, max_size=80)


def _spans(tok: ToyTokenizer, tokens: list[int]) -> set[tuple[int, int]]:
    spans, start = set(), 0
    for t in tokens:
        spans.add((start, start + len(tok.piece(t))))
        start += len(tok.piece(t))
    return spans


@settings(max_examples=150, deadline=None)
@given(code_words, identifiers, st.integers(1, 16), st.sampled_from(["smart", "prefix"]), st.booleans())
def test_any_resplit_of_the_predicted_text_is_followed_to_its_end(parts: list[str], at: str, k: int, mode: str,
                                                                  adaptive: bool) -> None:
    """The output writes the predicted text with other token boundaries: the cursor follows it to the
    end, and drafts are rejected only where the output has a token the prediction's encoding lacks."""
    text = "".join(parts)
    tok = ToyTokenizer()
    target = tok.split(text, at)
    prediction = tok.encode_text(text)
    lengths = AdaptiveLength(k) if adaptive else FixedLength(k)
    result = simulate(target, prediction, tok, k=k, mode=mode, lengths=lengths)  # type: ignore[arg-type]
    assert result.tokens == target
    assert result.state is not None and result.state.cursor == len(text.encode())
    assert result.rejected <= k * len(_spans(tok, target) - _spans(tok, prediction))


REPEATED = "        self.parser.set(self.parser.defaults)\n"


def test_repeated_lines_resume_after_the_edit_not_at_the_first_copy() -> None:
    """The output leaves out a line the prediction inserted among identical lines: the re-anchor
    resumes after that line instead of jumping back into the copies before it and hitting it again."""
    tok = ToyTokenizer()
    prediction_text = "def f(self):\n" + REPEATED * 6 + "    # TODO: check this\n" + REPEATED * 12
    target_text = "def f(self):\n" + REPEATED * 18
    target = tok.encode_text(target_text)
    result = simulate(target, tok.encode_text(prediction_text), tok, k=64, lengths=AdaptiveLength(64))
    assert result.tokens == target
    assert result.accepted >= 0.95 * len(target)


def test_aligner_prefers_the_first_fitting_copy_after_where_the_output_left() -> None:
    lines = [b"a\n", b"x\n", b"x\n", b"TODO\n", b"x\n", b"x\n", b"x\n", b"end\n"]
    aligner = LineAligner()
    context = [b"a\n", b"x\n", b"x\n", b"x\n"]
    assert aligner.align(context, lines, near=2) == 3
    assert aligner.align(context, lines, near=2, fits=lambda i: lines[i] != b"TODO\n") == 6
    assert aligner.align(context, lines, near=2, fits=lambda i: lines[i].startswith(b"e")) == 7
    assert aligner.align(context, lines, near=7) == 7
