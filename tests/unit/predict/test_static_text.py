"""Prediction proposer core: text cursor, re-anchoring inside lines, whitespace tolerance, the prompt
and output as draft sources, re-tokenisation, per-source counts (no engine)."""

from __future__ import annotations

from cascade.predict.code_datastore import CodeDatastore
from cascade.predict.draft_length import ConfidenceLength, FixedLength
from cascade.predict.prediction_text import collapse_blank_lines
from cascade.predict.simulator import simulate
from cascade.predict.static_text import PredictionState, normalise_newlines
from cascade.predict.vocabulary import text_of
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.predict.toy_tokens import CODE, ToyTokenizer


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
    assert result.prediction_accepted == 0
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


def test_inserted_line_reanchors_at_the_next_predicted_line() -> None:
    target_text = CODE.replace("        data = handle.read()\n", "        data = handle.read()\n        log(data)\n")
    target, prediction, tok = _pair(target_text, CODE)
    smart = simulate(target, prediction, tok, k=8)
    prefix = simulate(target, prediction, tok, k=8, mode="prefix")
    assert smart.tokens == target == prefix.tokens
    after_edit = len(target) - len(tok.encode_text(target_text.split("log(data)")[0]))
    assert smart.prediction_accepted > prefix.prediction_accepted + 0.8 * (after_edit - 20)


def test_removed_lines_reanchor() -> None:
    target, prediction, tok = _pair(CODE.replace("    items = []\n", ""), CODE)
    smart = simulate(target, prediction, tok, k=8)
    prefix = simulate(target, prediction, tok, k=8, mode="prefix")
    assert smart.prediction_accepted > prefix.prediction_accepted + 30


def test_renamed_variable_recovers_on_unchanged_lines() -> None:
    target, prediction, tok = _pair(CODE.replace("items", "entries"), CODE)
    smart = simulate(target, prediction, tok, k=8)
    prefix = simulate(target, prediction, tok, k=8, mode="prefix")
    assert smart.prediction_accepted > prefix.prediction_accepted + 15


def test_extracted_helper_reanchors_after_the_new_function() -> None:
    helper = "def strip_all(lines):\n    return [l.strip() for l in lines]\n\n"
    target, prediction, tok = _pair(CODE.replace("def parse(data):", helper + "def parse(data):"), CODE)
    smart = simulate(target, prediction, tok, k=8)
    assert smart.tokens == target
    tail = tok.encode_text(CODE.split("def parse(data):")[1])
    assert smart.prediction_accepted >= 0.8 * len(tail)


def test_crlf_prediction_matches_lf_output() -> None:
    target, prediction, tok = _pair(CODE, CODE.replace("\n", "\r\n"))
    result = simulate(target, prediction, tok, k=8)
    assert result.rejected == 0 and result.accepted >= len(target) - result.steps


def test_prefix_mode_never_reanchors() -> None:
    target, prediction, tok = _pair(CODE.replace("def load(path):", "def load(p):"), CODE)
    result = simulate(target, prediction, tok, k=8, mode="prefix")
    assert result.accepted <= 3


def test_same_text_with_other_token_boundaries_keeps_being_accepted() -> None:
    tok = ToyTokenizer()
    target = tok.split(CODE, "handle")
    prediction = tok.encode_text(CODE)
    assert target != prediction
    for mode in ("smart", "prefix"):
        result = simulate(target, prediction, tok, k=8, mode=mode)
        assert result.tokens == target
        assert result.state is not None and result.state.cursor == len(CODE.encode())
        assert result.accepted >= len(target) - result.steps - CODE.count("handle")
        assert result.state.retokenised >= CODE.count("handle")


words = st.sampled_from(["a", "b", "c", " ", "\n", "d:\n", "(", ")"])


@settings(max_examples=150, deadline=None)
@given(st.lists(words, max_size=60), st.lists(words, max_size=60), st.integers(1, 10),
       st.sampled_from(["smart", "prefix"]), st.booleans(), st.lists(st.lists(words, max_size=30), max_size=3))
def test_simulator_always_reproduces_target_and_counts_consistently(target_words: list[str],
                                                                    prediction_words: list[str], k: int,
                                                                    mode: str, adaptive: bool,
                                                                    elsewhere: list[list[str]]) -> None:
    tok = ToyTokenizer()
    target = [tok.id(w) for w in target_words]
    prediction = [tok.id(w) for w in prediction_words]
    lengths = ConfidenceLength(k) if adaptive else FixedLength(k)
    datastore = CodeDatastore.build([[tok.id(w) for w in code] for code in elsewhere], max_n=2)
    result = simulate(target, prediction, tok, k=k, mode=mode, lengths=lengths,  # type: ignore[arg-type]
                      datastore=datastore)
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
    lengths = ConfidenceLength(k) if adaptive else FixedLength(k)
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
    result = simulate(target, tok.encode_text(prediction_text), tok, k=64, lengths=ConfidenceLength(64))
    assert result.tokens == target
    assert result.prediction_accepted >= 0.95 * len(target)


def test_prefix_mode_follows_only_the_prediction_and_stops_at_the_first_miss() -> None:
    target, prediction, tok = _pair(CODE.replace("items", "entries"), CODE)
    result = simulate(target, prediction, tok, k=8, prompt=tok.encode_text(CODE), mode="prefix")
    assert result.state is not None
    assert result.proposed == result.state.drafted_by_source["prediction"]
    first_miss = len(tok.encode_text(CODE.split("items")[0]))
    assert result.prediction_accepted <= first_miss


def test_a_rename_inside_a_line_resumes_drafting_within_the_line() -> None:
    """After a renamed name the prediction drafts again a few tokens later, not at the next line."""
    tok = ToyTokenizer()
    prediction = tok.encode_text("result = compute(alpha, beta, gamma, delta)\nnext_line = 1\n")
    state = PredictionState(prediction, tok, lengths=ConfidenceLength(64))
    state.observe(tok.encode_text("result = compute"))
    state.propose(8)
    state.observe(tok.encode_text("_all"))
    state.propose(8)
    state.observe(tok.encode_text("(alpha, "))
    assert state.last_source is None and state.propose(8)[:2] == tok.encode_text("beta,")
    assert state.last_source == "prediction"


def test_a_look_alike_line_far_away_loses_to_the_region_being_edited() -> None:
    tok = ToyTokenizer()
    block = "    value = load(path)\n    return value\n"
    prediction_text = "def first():\n" + block + "\n" + "x = 1\n" * 40 + "def second():\n" + block
    prediction = tok.encode_text(prediction_text)
    state = PredictionState(prediction, tok)
    state.observe(tok.encode_text(prediction_text.split("def second")[0] + "def second():\n    valu"))
    state.observe(tok.encode_text("e = load_all"))
    state.observe(tok.encode_text("(path)\n"))
    assert state.cursor > len(prediction_text.split("def second")[0].encode())


def test_one_blank_line_where_the_prediction_has_two_keeps_the_cursor() -> None:
    """Chat answers collapse blank-line runs: the collapsed spelling takes over and holds."""
    text = CODE.replace("\n\ndef ", "\n\n\ndef ")
    target, prediction, tok = _pair(CODE, text)
    result = simulate(target, prediction, tok, k=16)
    assert result.tokens == target
    assert result.state is not None and result.state.spelling == 1
    assert result.prediction_accepted >= 0.85 * len(target) - 2 * result.steps


def test_a_fenced_answer_drafts_the_prediction_first_line_right_after_the_fence() -> None:
    tok = ToyTokenizer()
    state = PredictionState(tok.encode_text(CODE), tok)
    state.observe(tok.encode_text("Here is the file:\n"))
    assert state.propose(4) == []
    state.observe(tok.encode_text("```python\n"))
    assert state.propose(4) == tok.encode_text(CODE)[:4]
    state.observe(tok.encode_text("def load"))
    assert state.last_source is None and state.cursor == len(b"def load")


def test_a_useless_prediction_is_not_retried_at_every_line_start() -> None:
    tok = ToyTokenizer()
    for sampled in (False, True):
        state = PredictionState(tok.encode_text("zzz qqq unrelated"), tok, sampled=sampled)
        for line in CODE.splitlines(keepends=True):
            state.observe(tok.encode_text(line))
            draft = state.propose(8)
            assert state.last_source != "prediction"
            assert draft == [] or not sampled
        assert state.drafted_by_source["prediction"] == 0


def test_collapse_blank_lines_strips_trailing_space_and_blank_runs() -> None:
    assert collapse_blank_lines(b"a  \n\n\n \nb\t\nc\n\n") == b"a\n\nb\nc\n\n"


def test_new_code_shaped_like_the_prompt_is_drafted_from_the_prompt() -> None:
    tok = ToyTokenizer()
    helper = "def check_size(value):\n    assert value.size > 0, value\n    return value\n"
    prompt = tok.encode_text("Existing code:\n" + helper)
    target = tok.encode_text(helper.replace("size", "shape"))
    result = simulate(target, tok.encode_text("def check_size(value):\n    pass\n"), tok, k=16, prompt=prompt)
    assert result.state is not None
    copied = result.state.accepted_by_source["prompt"] + result.state.accepted_by_source["output"]
    assert copied >= 10


def test_a_sampled_request_whose_output_never_follows_the_prediction_drafts_nothing() -> None:
    target, _, tok = _pair(CODE, CODE)
    result = simulate(target, tok.encode_text("zebra quartz\n"), tok, k=8, prompt=target, sampled=True)
    assert result.accepted == result.prediction_accepted == 0
    assert result.proposed == result.prediction_rejected <= 8 * CODE.count("\n")


def test_a_greedy_request_copies_from_its_prompt_even_when_the_prediction_is_useless() -> None:
    target, _, tok = _pair(CODE, CODE)
    result = simulate(target, tok.encode_text("zebra quartz\n"), tok, k=8, prompt=target)
    assert result.state is not None
    assert result.prediction_accepted == 0
    assert result.state.accepted_by_source["prompt"] > len(target) // 2
    assert result.steps < len(target) // 2


def test_usage_counts_only_drafts_from_the_prediction() -> None:
    tok = ToyTokenizer()
    prompt = tok.encode_text(CODE)
    target = tok.encode_text(CODE + "\n" + CODE)
    result = simulate(target, tok.encode_text(CODE), tok, k=16, prompt=prompt)
    state = result.state
    assert state is not None
    assert result.proposed == sum(state.drafted_by_source.values())
    assert result.accepted == sum(state.accepted_by_source.values())
    assert result.prediction_accepted == state.accepted_by_source["prediction"]
    assert result.prediction_accepted + result.prediction_rejected == state.drafted_by_source["prediction"]
    assert state.accepted_by_source["prompt"] + state.accepted_by_source["output"] > 0


def test_draft_length_grows_with_how_long_the_anchor_has_held() -> None:
    tok = ToyTokenizer()
    text = CODE * 6
    target = tok.encode_text(text)
    result = simulate(target, target, tok, k=64)
    assert result.rejected == 0
    assert result.steps <= len(target) // 65 + 5
    edited = tok.encode_text(text.replace("items.append", "items.add"))
    drafted = simulate(edited, target, tok, k=64).drafted_per_step
    after_edit = drafted[drafted.index(0, 2):]
    grows = [d for d in after_edit if d]
    assert grows[0] < 64 and max(grows) == 64


def _state_where_the_prompt_copy_wins_on_evidence(cursor_tokens: int) -> tuple[PredictionState, list[int]]:
    """The prompt holds the prediction (as a user's edit request does); the output followed it for
    ``cursor_tokens`` (≥ 16) tokens; the prediction's anchor has less evidence than the prompt's 16-token
    n-gram, but more than its half (a copy's evidence counts half towards its draft length)."""
    tok = ToyTokenizer()
    ids = tok.encode_text(CODE * 3)
    state = PredictionState(ids, tok, prompt_ids=ids, k=64)
    state.observe(ids[:cursor_tokens])
    ngram_bytes = len(text_of(tok, ids[cursor_tokens - 16:cursor_tokens]))
    state.evidence = ngram_bytes * 3 // 4
    return state, ids


def test_a_prompt_copy_that_agrees_with_the_prediction_lets_the_prediction_draft_its_longer_draft() -> None:
    state, ids = _state_where_the_prompt_copy_wins_on_evidence(20)
    draft = state.propose(64)
    assert state.last_source == "prediction"
    assert len(draft) >= ConfidenceLength(64).length(state.evidence) and draft == ids[20:20 + len(draft)]
    assert state.drafted_by_source == {"prediction": len(draft), "prompt": 0, "output": 0, "responses": 0,
                                      "successors": 0}


def test_a_prompt_copy_that_disagrees_with_the_prediction_drafts_itself() -> None:
    state, ids = _state_where_the_prompt_copy_wins_on_evidence(20)
    state.cursor += len(CODE.encode())  # the prediction is followed one copy of CODE further on
    state.cursor += 1  # …and one byte off: its draft no longer agrees with the prompt's
    draft = state.propose(64)
    assert state.last_source == "prompt"
    assert draft == ids[20:20 + len(draft)] and 0 < len(draft) < ConfidenceLength(64).length(state.evidence)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 60), st.integers(0, 300), st.integers(0, 400), st.integers(1, 64))
def test_whichever_source_drafts_the_draft_continues_the_followed_text(at: int, evidence: int, held: int,
                                                                       limit: int) -> None:
    tok = ToyTokenizer()
    ids = tok.encode_text(CODE * 3)
    state = PredictionState(ids, tok, prompt_ids=ids, k=64)
    state.observe(ids[:at])
    state.evidence, state.copy_held = evidence, held
    draft = state.propose(limit)
    assert 0 < len(draft) <= limit
    assert draft == ids[at:at + len(draft)]
    assert state.proposed == len(draft) and state.last_source in ("prediction", "prompt")


def test_a_prompt_ngram_that_continues_like_the_prediction_lengthens_its_draft() -> None:
    tok = ToyTokenizer()
    ids = tok.encode_text(CODE * 3)
    alone = PredictionState(ids, tok, k=64)
    backed = PredictionState(ids, tok, prompt_ids=ids, k=64)
    evidence = len(text_of(tok, ids[4:20]))  # as much as the prompt's 16-token n-gram: the prediction drafts
    for state in (alone, backed):
        state.observe(ids[:20])
        state.evidence = evidence
    plain = alone.propose(64)
    assert len(plain) == ConfidenceLength(64).length(evidence) < 64
    longer = backed.propose(64)
    assert backed.last_source == "prediction" and len(longer) > len(plain)
    assert longer == ids[20:20 + len(longer)]


def test_a_prompt_ngram_that_continues_otherwise_lends_no_length() -> None:
    tok = ToyTokenizer()
    ids = tok.encode_text(CODE * 3)
    other = ids[:20] + tok.encode_text(" zebra quartz\n")  # the prompt went on otherwise from there
    state = PredictionState(ids, tok, prompt_ids=other, k=64, min_prompt_evidence=10**6)
    state.observe(ids[:20])
    state.evidence = 12
    assert len(state.propose(64)) == ConfidenceLength(64).length(12)


FILE_WITH_RUNS = "import os\n\n\ndef load(path):\n    return os.path.exists(path)\n\n\ndef save(path):\n    pass\n"


def test_a_fenced_answer_is_first_drafted_with_one_blank_line_where_the_file_has_two() -> None:
    tok = ToyTokenizer()
    answer = "```python\n" + collapse_blank_lines(FILE_WITH_RUNS.encode()).decode() + "```"
    result = simulate(tok.encode_text(answer), tok.encode_text(FILE_WITH_RUNS), tok, k=64)
    assert result.state is not None and result.state.spelling == 1
    assert result.prediction_rejected == 0
    assert result.prediction_accepted >= len(tok.encode_text(FILE_WITH_RUNS)) - 6


def test_a_fenced_answer_that_keeps_the_files_blank_lines_returns_to_the_exact_spelling() -> None:
    tok = ToyTokenizer()
    answer = "```python\n" + FILE_WITH_RUNS + "```"
    result = simulate(tok.encode_text(answer), tok.encode_text(FILE_WITH_RUNS), tok, k=64)
    assert result.state is not None and result.state.spelling == 0
    assert result.tokens == tok.encode_text(answer)
    assert result.prediction_accepted >= len(tok.encode_text(FILE_WITH_RUNS)) - 12


def test_a_sampled_answer_of_fences_that_never_follows_the_prediction_draws_no_draft() -> None:
    """Any draft may change which sample a seed gives: a sampled request drafts the prediction's
    start after a fence only on evidence, not as a guess at every fence."""
    tok = ToyTokenizer()
    target = tok.encode(b"```\n```\n```python\nprint('hello')\n```\n")
    useless = tok.encode("§§§ ¤¤¤ ¶¶¶\nnothing here is written\n".encode())
    assert simulate(target, useless, tok, 16, sampled=True).proposed == 0
    assert simulate(target, useless, tok, 16).proposed > 0  # greedy: the output is the same whatever is drafted


def test_a_fresh_anchor_drafts_shorter_in_a_crowded_step_and_a_held_one_does_not() -> None:
    tok = ToyTokenizer()
    ids = tok.encode_text(CODE * 3)
    fresh = PredictionState(ids, tok, k=64)
    fresh.observe(ids[:20])
    fresh.evidence = 40
    alone, crowded = fresh.propose(64), fresh.propose(64, rows=8)
    assert len(crowded) < len(alone) and crowded == alone[:len(crowded)]
    held = PredictionState(ids, tok, k=64)
    held.observe(ids[:20])  # the prediction's start: its whole text is the evidence
    assert len(held.propose(64, rows=8)) == len(held.propose(64)) == 64


ELSEWHERE = "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n"


def _datastore(tok: ToyTokenizer, text: str = ELSEWHERE, copies: int = 3) -> CodeDatastore:
    return CodeDatastore.build([tok.encode_text(text)] * copies)


def test_new_code_the_request_has_never_seen_is_drafted_from_code_elsewhere() -> None:
    tok = ToyTokenizer()
    new_code = "class Pair:\n    def __init__(self, x, y):\n        self.x = x\n"
    target = tok.encode_text(new_code)
    store = _datastore(tok)
    without = simulate(target, tok.encode_text("zebra quartz\n"), tok, k=8, datastore=None)
    result = simulate(target, tok.encode_text("zebra quartz\n"), tok, k=8, datastore=store)
    assert result.tokens == target and result.state is not None
    assert result.state.accepted_by_source["successors"] > without.state.accepted_by_source["successors"]  # type: ignore[union-attr]
    assert result.prediction_accepted == result.prediction_rejected == 0  # usage: prediction drafts only
    assert result.steps < without.steps


def test_a_toy_vocabulary_runs_without_the_services_datastore() -> None:
    tok = ToyTokenizer()
    target = tok.encode_text(ELSEWHERE)
    prediction = tok.encode_text("zebra quartz\n")
    default = simulate(target, prediction, tok, k=8)
    assert default.drafted_per_step == simulate(target, prediction, tok, k=8, datastore=None).drafted_per_step
    assert default.steps > simulate(target, prediction, tok, k=8, datastore=_datastore(tok)).steps


def test_a_sampled_request_whose_output_never_follows_the_prediction_draws_nothing_from_code_elsewhere() -> None:
    tok = ToyTokenizer()
    target = tok.encode_text(ELSEWHERE)
    result = simulate(target, tok.encode_text("zebra quartz\n"), tok, k=8, sampled=True, datastore=_datastore(tok))
    assert result.proposed == result.prediction_rejected


def test_a_crowded_step_needs_a_likelier_draft_from_code_elsewhere() -> None:
    tok = ToyTokenizer()
    store = CodeDatastore.build([tok.encode_text("x = 1\n"), tok.encode_text("x = 2\n")] * 2)  # "=": "1" or "2"
    state = PredictionState(tok.encode_text("zebra"), tok, k=8, datastore=store)
    state.observe(tok.encode_text("y = "))
    alone = state.propose(8)
    assert alone and alone == store.propose(tok.encode_text("y = "), 8, 0.5)
    assert state.propose(8, rows=8) == []
