"""The exact forward pass: the same integers whatever the batch, path, split point or thread count,
and close to the float computation it stands in for."""

from __future__ import annotations

import math
import random

import pytest
import torch
from cascade.codec.exact.cache import KVCache
from cascade.codec.exact.grid import rint
from cascade.codec.exact.model import ExactConfig, ExactLlama, UnsupportedModelError
from cascade.codec.exact.ops import rms_norm, silu
from cascade.codec.exact.tables import sigmoid_table
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.codec.exact_fixtures import TINY, tiny_model

VOCAB = TINY["vocab_size"]


def _sequences(seed: int, count: int, low: int = 1, high: int = 60) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(rng.randint(low, high))] for _ in range(count)]


def _prefill_logits(model: ExactLlama, sequences: list[list[int]]) -> list[torch.Tensor]:
    logits = model.logits(model.prefill(sequences))
    out, start = [], 0
    for s in sequences:
        out.append(logits[start:start + len(s)])
        start += len(s)
    return out


def _decode_logits(model: ExactLlama, sequences: list[list[int]], prefix: int) -> list[torch.Tensor]:
    """Prefill the first ``prefix`` tokens of each (equal-length) sequence, then decode step by step."""
    c = model.config
    cache = KVCache.allocate(len(sequences), max(len(s) for s in sequences), c.num_layers, c.num_kv_heads,
                             c.head_dim)
    hidden = model.prefill([s[:prefix] for s in sequences], cache, list(range(len(sequences))))
    ends = torch.tensor([prefix * (i + 1) - 1 for i in range(len(sequences))])
    rows = [model.logits(hidden[ends])]
    for t in range(prefix, len(sequences[0])):
        rows.append(model.logits(model.step(torch.tensor([s[t] for s in sequences]), cache)))
    stacked = torch.stack(rows, dim=1)
    return [stacked[i] for i in range(len(sequences))]


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10**6), st.integers(2, 9))
def test_a_sequence_gets_the_same_logits_alone_and_in_any_batch(seed: int, count: int) -> None:
    model = tiny_model()
    sequences = _sequences(seed, count)
    together = _prefill_logits(model, sequences)
    order = list(range(count))
    random.Random(seed).shuffle(order)
    shuffled = _prefill_logits(model, [sequences[i] for i in order])
    for position, i in enumerate(order):
        assert torch.equal(together[i], shuffled[position])
        assert torch.equal(together[i], _prefill_logits(model, [sequences[i]])[0])


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 30))
def test_prefill_and_decode_steps_give_identical_integers_at_any_split_point(seed: int, prefix: int) -> None:
    model = tiny_model()
    sequences = [s[:40] for s in _sequences(seed, 3, low=40, high=40)]
    prefilled = _prefill_logits(model, sequences)
    decoded = _decode_logits(model, sequences, prefix)
    for full, stepped in zip(prefilled, decoded, strict=True):
        assert torch.equal(full[prefix - 1:], stepped)


def test_thread_count_does_not_change_a_bit() -> None:
    model = tiny_model()
    sequences = _sequences(7, 6, low=50, high=100)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _prefill_logits(model, sequences)
        torch.set_num_threads(max(2, before))
        many = _prefill_logits(model, sequences)
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(one, many, strict=True))


def _float_reference(model: ExactLlama, tokens: list[int]) -> torch.Tensor:
    """The same network in plain float64 (libm exp/sigmoid/cos, no quantisation)."""
    from cascade.codec.exact.tables import rope_tables

    from tests.unit.codec.exact_fixtures import tiny_weights

    w = {k: v.to(torch.float64) for k, v in tiny_weights(TINY).items()}
    c = model.config
    n = len(tokens)
    cos, sin = (torch.from_numpy(t[:n]) for t in rope_tables(c.head_dim, c.rope_theta, model.max_positions))

    def norm(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + c.rms_norm_eps) * g

    def rope(x: torch.Tensor) -> torch.Tensor:
        half = c.head_dim // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos[:, None] - x2 * sin[:, None], x2 * cos[:, None] + x1 * sin[:, None]], -1)

    x = w["model.embed_tokens.weight"][tokens]
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        h = norm(x, w[p + "input_layernorm.weight"])
        q = rope((h @ w[p + "self_attn.q_proj.weight"].T + w[p + "self_attn.q_proj.bias"]).view(n, c.num_heads, -1))
        k = rope((h @ w[p + "self_attn.k_proj.weight"].T + w[p + "self_attn.k_proj.bias"]).view(n, c.num_kv_heads, -1))
        v = (h @ w[p + "self_attn.v_proj.weight"].T + w[p + "self_attn.v_proj.bias"]).view(n, c.num_kv_heads, -1)
        group = c.num_heads // c.num_kv_heads
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(c.head_dim)
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
        out = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, -1)
        x = x + out @ w[p + "self_attn.o_proj.weight"].T
        h = norm(x, w[p + "post_attention_layernorm.weight"])
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    return norm(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


def test_exact_logits_stay_close_to_the_float_network() -> None:
    model = tiny_model()
    tokens = _sequences(3, 1, low=100, high=100)[0]
    exact = model.logits(model.prefill([tokens])).to(torch.float64) / 2**16
    reference = _float_reference(model, tokens)
    assert (exact - reference).abs().max() < 0.25
    exact_lp, ref_lp = exact.log_softmax(-1), reference.log_softmax(-1)
    agree = (exact.argmax(-1) == reference.argmax(-1)).double().mean()
    assert agree > 0.95
    assert (exact_lp - ref_lp).exp().mul(ref_lp.exp()).sum(-1).min() > 0  # sanity: finite distributions
    kl = (ref_lp.exp() * (ref_lp - exact_lp)).sum(-1).mean()
    assert kl < 0.01, f"KL(float || exact) = {kl:.4f} nats"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=64))
def test_rint_rounds_half_to_even_like_torch_round(values: list[float]) -> None:
    x = torch.tensor([*values, 0.5, 1.5, 2.5, -0.5, -2.5], dtype=torch.float64)
    assert torch.equal(rint(x), torch.round(x))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-40, 40, allow_nan=False), min_size=1, max_size=64))
def test_fixed_point_silu_is_within_its_stated_bound(values: list[float]) -> None:
    """Sigmoid is read at the nearest 2**-10 grid point: |error| ≤ |x|·2**-12 + 2**-52·|x|, and sigmoid
    is flat to 1e-7 beyond ±16 (where the table is clamped)."""
    x = torch.tensor(values, dtype=torch.float64)
    error = (silu(x, torch.from_numpy(sigmoid_table())) - torch.nn.functional.silu(x)).abs()
    assert bool((error <= x.abs() * (2**-12 + 1.2e-7) + 1e-15).all())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4, allow_nan=False), min_size=4, max_size=64))
def test_fixed_point_rms_norm_is_within_1e_4_relative_of_float(values: list[float]) -> None:
    x = torch.tensor([values], dtype=torch.float64)
    gain = torch.ones(len(values), dtype=torch.float64)
    exact = rms_norm(x, gain, 1e-6)
    reference = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)
    assert bool(((exact - reference).abs() <= reference.abs().amax() * 1e-4 + 1e-12).all())


def test_unsupported_architectures_and_rope_types_are_refused_by_name() -> None:
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel"):
        ExactConfig.from_hf({**TINY, "architectures": ["GPT2LMHeadModel"]})
    with pytest.raises(UnsupportedModelError, match="yarn"):
        ExactConfig.from_hf({**TINY, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(UnsupportedModelError, match="gelu"):
        ExactConfig.from_hf({**TINY, "hidden_act": "gelu"})
