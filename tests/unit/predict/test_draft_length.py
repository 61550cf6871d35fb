"""Adaptive draft length: long drafts while the prediction is accepted, short or none when it is not."""

from __future__ import annotations

from cascade.predict.draft_length import AdaptiveLength, FixedLength
from cascade.predict.simulator import simulate
from cascade.predict.static_text import PredictionState

from tests.unit.predict.toy_tokens import CODE, ToyTokenizer


def test_length_starts_at_k_and_doubles_back_after_a_short_run() -> None:
    lengths = AdaptiveLength(64)
    assert lengths.length() == 64
    lengths.update(64, 5, on_track=False)
    seen = []
    for _ in range(5):
        seen.append(lengths.length())
        lengths.update(lengths.length(), lengths.length(), on_track=True)
    assert seen == [12, 24, 48, 64, 64]


def test_other_token_boundaries_keep_the_length_and_divergences_shrink_it_to_the_floor() -> None:
    lengths = AdaptiveLength(64, start=16)
    lengths.update(16, 16, on_track=True)
    lengths.update(32, 3, on_track=True)
    assert lengths.length() == 32
    lengths.update(32, 20, on_track=False)
    assert lengths.length() == 32
    lengths.update(32, 0, on_track=False)
    assert lengths.length() == 4
    lengths.update(0, 0, on_track=False)
    assert lengths.length() == 4


def test_long_exact_prediction_needs_few_steps_with_adaptive_length() -> None:
    tok = ToyTokenizer()
    text = CODE * 6
    target = tok.encode_text(text)
    adaptive = simulate(target, target, tok, k=64, lengths=AdaptiveLength(64))
    fixed = simulate(target, target, tok, k=8, lengths=FixedLength(8))
    assert adaptive.rejected == 0 == fixed.rejected
    assert adaptive.steps <= len(target) // 65 + 5
    assert adaptive.steps * 4 < fixed.steps


def test_after_a_local_edit_the_draft_that_follows_is_accepted() -> None:
    tok = ToyTokenizer()
    text = CODE * 4
    target_text = text.replace("        data = handle.read()\n", "        data = handle.read(1024)\n", 1)
    target = tok.encode_text(target_text)
    result = simulate(target, tok.encode_text(text), tok, k=64, lengths=AdaptiveLength(64))
    assert result.tokens == target
    edited_line = target_text.split("\n").index("        data = handle.read(1024)")
    after = tok.encode_text("\n".join(target_text.split("\n")[edited_line + 1:]))
    assert result.accepted >= 0.9 * len(after)


def test_repeated_false_reanchors_back_off() -> None:
    """Every output line "x = 1" anchors on the prediction, whose next line never follows: the
    proposer tries again after 1, 3, 7, … completed lines instead of after every one."""
    tok = ToyTokenizer()
    prediction = tok.encode_text("x = 1\nnever written\n" * 3)
    state = PredictionState(prediction, tok, lengths=AdaptiveLength(64))
    lines = 0
    for i in range(64):
        state.observe(tok.encode_text("x = 1\n"))
        state.propose(64)
        state.observe(tok.encode_text(f"other_{i}\n"))
        state.propose(64)
        lines += 2
    assert state.reanchors >= 3
    assert state.alignments <= 12 < lines
    assert state.accepted == 0 and state.proposed <= 64 + state.reanchors * 8
