"""The KV cache the runner schedules with: shared prefixes copied into lanes, caches joined mid-run,
its byte counts for memory admission, and its integer storage."""

from __future__ import annotations

import random

import torch
from cascade.codec.exact.cache import KVCache, bytes_per_row_position
from cascade.codec.exact.model import ExactConfig, ExactLlama

from tests.unit.codec.exact_fixtures import TINY, tiny_model, tiny_weights

VOCAB = int(str(TINY["vocab_size"]))


def _tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(n)]


def _alone(model: ExactLlama, sequence: list[int]) -> torch.Tensor:
    """The logits of every position after the first, each sequence prefilled on its own."""
    return model.logits(model.prefill([sequence]))


def test_a_context_copied_into_lanes_decodes_like_each_lane_prefilled_alone() -> None:
    model = tiny_model()
    context = _tokens(1, 30)
    lanes = [_tokens(10 + i, 12) for i in range(3)]
    cache = model.allocate_cache(4, 60)
    hidden = model.prefill([context], cache, [0])
    cache.copy_prefix(0, torch.tensor([1, 2, 3]), len(context))
    cache.keep(torch.tensor([1, 2, 3]))
    assert cache.lengths.tolist() == [30, 30, 30]
    first = model.logits(hidden[-1:])
    steps = []
    for t in range(len(lanes[0])):
        steps.append(model.logits(model.step(torch.tensor([lane[t] for lane in lanes]), cache)))
    for i, lane in enumerate(lanes):
        alone = _alone(model, context + lane)
        assert torch.equal(alone[len(context) - 1], first[0])
        assert torch.equal(alone[len(context):], torch.stack([s[i] for s in steps]))


def test_a_cache_appended_mid_run_continues_every_row_as_if_it_ran_alone() -> None:
    model = tiny_model()
    a_seqs, b_seqs = [_tokens(2, 20), _tokens(3, 9)], [_tokens(4, 40)]
    a = model.allocate_cache(2, 30)
    model.prefill([s[:5] for s in a_seqs], a, [0, 1])
    for t in range(5, 8):
        model.step(torch.tensor([s[t] for s in a_seqs]), a)
    b = model.allocate_cache(1, 50)
    model.prefill([b_seqs[0][:20]], b, [0])
    a.append(b)
    assert a.capacity == 50 and a.lengths.tolist() == [8, 8, 20]
    logits = model.logits(model.step(torch.tensor([a_seqs[0][8], a_seqs[1][8], b_seqs[0][20]]), a))
    assert torch.equal(logits[0], _alone(model, a_seqs[0][:9])[-1])
    assert torch.equal(logits[1], _alone(model, a_seqs[1][:9])[-1])
    assert torch.equal(logits[2], _alone(model, b_seqs[0][:21])[-1])


def test_byte_counts_match_the_tensors_a_cache_holds() -> None:
    c = tiny_model().config
    cache = KVCache.allocate(5, 70, c.num_layers, c.num_kv_heads, c.head_dim)
    per = bytes_per_row_position(c)
    assert per == 2 * c.num_layers * c.num_kv_heads * c.head_dim * 4
    assert cache.nbytes() == 5 * 70 * per
    cache.resize(90, torch.tensor([4, 1]))
    assert cache.nbytes() == 2 * 90 * per and cache.capacity == 90 and cache.rows == 2


def test_the_cache_holds_int32_unless_a_short_context_needs_wider_integers() -> None:
    assert tiny_model().allocate_cache(1, 8).dtype == torch.int32
    short = ExactLlama(ExactConfig.from_hf(TINY), tiny_weights(TINY), 16)
    assert short.cache_dtype == torch.int64
    cache = short.allocate_cache(1, 16)
    hidden = short.prefill([_tokens(5, 10)], cache, [0])
    assert torch.equal(short.logits(short.step(torch.tensor([7]), cache)),
                       short.logits(short.prefill([[*_tokens(5, 10), 7]]))[-1:])
    assert hidden.shape[0] == 10


def test_codec_device_auto_follows_the_engines_and_cuda_is_refused_without_a_gpu() -> None:
    import pytest
    from cascade.codec.exact.device import resolve_codec_device

    assert resolve_codec_device("auto", "cpu") == torch.device("cpu")
    assert resolve_codec_device("cpu", "cuda") == torch.device("cpu")
    if not torch.cuda.is_available():
        assert resolve_codec_device("auto") == torch.device("cpu")
        with pytest.raises(ValueError, match="no CUDA device"):
            resolve_codec_device("cuda")


def test_auto_moves_the_codec_to_the_cpu_where_the_device_fails_the_known_answer() -> None:
    """Under ``auto`` a GPU that computes other integers (its square root is correctly rounded, the
    numerics' is torch's CPU one) must not leave the codec off: it computes on the CPU instead; an
    explicit ``cuda`` is kept, for the self-test to report."""
    from cascade.codec.exact.device import load_where_integers_agree
    from cascade.codec.exact.known_answer import KnownAnswerError

    loaded: list[str] = []

    def load(device: torch.device) -> str:
        loaded.append(device.type)
        return device.type

    def check(model: str) -> None:
        if model == "cuda":
            raise KnownAnswerError("made under different numerics: the exact model's layer0 differs")

    cuda = torch.device("cuda")
    model, moved = load_where_integers_agree("auto", cuda, load, check)
    assert model == "cpu" and loaded == ["cuda", "cpu"] and moved is not None and "layer0" in moved
    assert load_where_integers_agree("cuda", cuda, load, check) == ("cuda", None)
    assert load_where_integers_agree("auto", torch.device("cpu"), load, check) == ("cpu", None)
    assert load_where_integers_agree("auto", cuda, load, lambda model: None) == ("cuda", None)
