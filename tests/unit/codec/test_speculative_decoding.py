"""Speculative exact decoding: a verify pass over drafted positions computes what step-by-step decoding
computes, so any draft — right, wrong, random or adversarial — decodes exactly the tokens the plain
decoder decodes, and right drafts save steps."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Hashable, Sequence

import pytest
import torch
from cascade.codec.exact.runner import ExactRunner
from cascade.codec.lanes import lane_lengths, split_lanes
from cascade.predict.token_source import TokenNgramSource
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.codec.exact_fixtures import tiny_model

VOCAB = tiny_model().config.vocab_size


def _tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(n)]


@settings(max_examples=12, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 20), st.integers(0, 6)), min_size=1, max_size=4), st.integers(0, 99))
def test_a_verify_pass_over_drafted_positions_gives_the_hidden_states_of_step_by_step_decoding(
        rows: list[tuple[int, int]], seed: int) -> None:
    """Rows at different lengths, each fed 1 + k tokens in one pass, against one token per step."""
    model = tiny_model()
    sequences = [_tokens(seed + i, length + k + 1) for i, (length, k) in enumerate(rows)]
    stepped = model.allocate_cache(len(rows), 40)
    verified = model.allocate_cache(len(rows), 40)
    for cache in (stepped, verified):
        model.prefill([s[:length] for s, (length, _) in zip(sequences, rows, strict=True)], cache,
                      list(range(len(rows))))
    expected: list[torch.Tensor] = []
    for i, (length, k) in enumerate(rows):
        alone = model.allocate_cache(1, 40)
        model.prefill([sequences[i][:length]], alone, [0])
        expected += [model.step(torch.tensor([t]), alone) for t in sequences[i][length:length + k + 1]]
    tokens = [t for s, (length, k) in zip(sequences, rows, strict=True) for t in s[length:length + k + 1]]
    cache_rows = [i for i, (_, k) in enumerate(rows) for _ in range(k + 1)]
    positions = [p for length, k in rows for p in range(length, length + k + 1)]
    hidden = model.verify(torch.tensor(tokens), verified, torch.tensor(cache_rows), torch.tensor(positions))
    assert torch.equal(hidden, torch.cat(expected))
    assert torch.equal(model.logits(hidden), model.logits(torch.cat(expected)))


class _Scripted:
    """Drafts from the true lanes, corrupted at a chosen rate (0: always right; 1: always wrong —
    a corrupted token is never the true one), or only random tokens."""

    def __init__(self, truth: list[list[int]], error_rate: float, seed: int, random_only: bool = False) -> None:
        self.index = TokenNgramSource(min_n=1, max_n=8)
        for i, lane in enumerate(truth):
            self.index.add(("truth", i), lane)
        self.rng = random.Random(seed)
        self.error_rate = error_rate
        self.random_only = random_only

    def add(self, key: Hashable, tokens: Sequence[int]) -> None:
        pass

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        if self.random_only:
            return [self.rng.randrange(VOCAB) for _ in range(self.rng.randrange(k + 1))]
        draft = self.index.propose(context, k)
        return [(t + 1 + self.rng.randrange(VOCAB - 1)) % VOCAB if self.rng.random() < self.error_rate else t
                for t in draft]


def _round_trip(runner: ExactRunner, tokens: list[int], lane: int, top_k: int = 16, precision: int = 32
                ) -> list[list[int]]:
    async def main() -> list[list[int]]:
        coded = await runner.encode([1, 7], split_lanes(tokens, lane), top_k, precision)
        return await runner.decode([1, 7], lane_lengths(len(tokens), lane), coded.payload, top_k, precision)
    return asyncio.run(main())


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(8, 70), st.integers(3, 40), st.sampled_from([0.0, 0.2, 0.6, 1.0]), st.booleans(),
       st.integers(1, 16), st.integers(0, 999))
def test_any_drafts_decode_exactly_the_tokens_of_the_plain_decoder(n: int, lane: int, error_rate: float,
                                                                   random_only: bool, max_draft: int,
                                                                   seed: int) -> None:
    """Repetitive text (so drafts are long), cut into lanes of a segment; drafts from the truth with
    errors, always wrong, or random. A wrong draft must only cost work."""
    base = _tokens(seed, 6)
    tokens = [(t + (i // 17)) % VOCAB if i % 5 == 0 else t for i, t in enumerate((base * 20)[:n])]
    truth = split_lanes(tokens, lane)
    plain = ExactRunner(tiny_model(), VOCAB, max_draft=0)
    guessing = ExactRunner(tiny_model(), VOCAB, max_draft=max_draft,
                           draft_source=lambda: _Scripted(truth, error_rate, seed, random_only))
    try:
        assert _round_trip(guessing, tokens, lane) == _round_trip(plain, tokens, lane) == truth
        assert plain.stats.drafted_tokens == 0 and plain.stats.tokens_per_row_step() == 1.0
    finally:
        plain.close()
        guessing.close()


def test_wrong_drafts_cost_no_extra_steps_and_stop_while_right_drafts_grow_and_save_steps() -> None:
    """Counted, not timed: with the truth as drafts a single-lane segment of 60 tokens takes a handful
    of steps; with always-wrong drafts exactly as many steps as tokens (one per step, as without), and
    the lane stops drafting after its first misses (it only guesses). Distinct tokens, so the scripted
    drafter's match is unique."""
    tokens = random.Random(5).sample(range(8, VOCAB), 60)  # none of the prompt's ids
    counts = {}
    for name, rate in (("right", 0.0), ("wrong", 1.0)):
        runner = ExactRunner(tiny_model(), VOCAB, max_draft=16,
                             draft_source=lambda rate=rate: _Scripted([tokens], rate, 1))  # type: ignore[misc]
        try:
            assert _round_trip(runner, tokens, 60) == [tokens]
            counts[name] = (runner.stats.decode_steps, runner.stats.accepted_tokens, runner.stats.drafted_tokens)
        finally:
            runner.close()
    assert counts["wrong"][0] == 60 and counts["wrong"][1] == 0 and counts["wrong"][2] <= 2
    # one drafted token first, longer as the guesses keep being right, up to 16
    assert counts["right"] == (10, 50, 50)


def test_the_ngram_drafter_saves_steps_on_repetitive_text_and_decodes_exactly() -> None:
    """The default drafter (``TokenNgramSource`` over the context and the decoded lanes)."""
    block = _tokens(11, 12)
    tokens = block * 8
    runner = ExactRunner(tiny_model(), VOCAB)
    try:
        assert _round_trip(runner, tokens, 48) == split_lanes(tokens, 48)
        assert runner.stats.decode_steps < 48 * 2 // 3
        assert runner.stats.tokens_per_row_step() > 1.5
    finally:
        runner.close()


@pytest.mark.parametrize("max_draft", [0, 16])
def test_speculation_leaves_no_rows_behind(max_draft: int) -> None:
    runner = ExactRunner(tiny_model(), VOCAB, max_draft=max_draft)
    try:
        tokens = _tokens(3, 50)
        assert _round_trip(runner, tokens, 7) == split_lanes(tokens, 7)
        for _ in range(200):  # the worker drops the rows just after it answers
            if runner.live_rows() == 0:
                break
            time.sleep(0.01)
        assert runner.live_rows() == 0 and runner.live_jobs() == 0
    finally:
        runner.close()


@pytest.mark.parametrize("interleave", [8, 10_000])
def test_compression_prefill_between_decode_steps_stays_within_its_credit(interleave: int) -> None:
    """Counted, not timed: while a 60-step decode runs beside a queued 1,300-token compression, the
    prefill run between its steps is at most ``rows fed · interleave_tokens + prefill_tokens`` plus
    one chunk (the bound a waiting decode step gets, in tokens of work ahead of it) — and compression
    still progresses. With an unbounded credit (the old schedule) a chunk runs every step."""
    prefill = 64
    runner = ExactRunner(tiny_model(), VOCAB, max_draft=0, prefill_tokens=prefill, interleave_tokens=interleave)
    lane = _tokens(41, 60)
    uploads = [_tokens(50 + i, 120) for i in range(10)]

    async def main() -> None:
        coded = await runner.encode([1], [lane], 16, 32)
        flood = [asyncio.ensure_future(runner.encode([1], split_lanes(t, 20), 16, 32, request="upload"))
                 for t in uploads]
        await asyncio.sleep(0)
        steps, rows, spent = (runner.stats.decode_steps, runner.stats.row_steps,
                              runner.stats.interleaved_prefill_tokens)
        assert await runner.decode([1], [60], coded.payload, 16, 32, request="small") == [lane]
        steps = runner.stats.decode_steps - steps
        rows = runner.stats.row_steps - rows
        spent = runner.stats.interleaved_prefill_tokens - spent
        assert steps == 60 and rows >= steps and spent > 0
        if interleave == 8:
            assert spent <= rows * interleave + prefill + prefill
        else:
            assert spent > 10 * prefill
        await asyncio.gather(*flood)

    try:
        asyncio.run(main())
    finally:
        runner.close()
