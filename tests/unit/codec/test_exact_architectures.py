"""Architectures the exact model runs (RoPE scaling as Hugging Face and vLLM define it, every bias a
Llama checkpoint may carry) and the ones it refuses with the reason (sliding windows, unread weights)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from cascade.codec.exact.model import ExactConfig, ExactLlama, UnsupportedModelError
from cascade.codec.exact.tables import RopeScaling, inverse_frequencies, rope_tables

from tests.unit.codec.numerics_matrix import CONFIGS, random_weights

LLAMA = CONFIGS["llama-mha"]


def _float_inverse_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    return 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def _ours(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    return torch.tensor([float(f) for f in inverse_frequencies(head_dim, theta, scaling)], dtype=torch.float64)


def test_llama3_frequencies_match_the_hugging_face_definition() -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192, "rope_theta": 500000.0}
    hf = LlamaConfig(hidden_size=2048, num_attention_heads=32, head_dim=64, max_position_embeddings=131072,
                     rope_parameters=rope)
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
    config = ExactConfig.from_hf({**LLAMA, "max_position_embeddings": 131072, "rope_parameters": rope,
                                  "head_dim": 64})
    assert config.rope_scaling == RopeScaling("llama3", 32.0, 1.0, 4.0, 8192)
    ours = _ours(64, 500000.0, config.rope_scaling)
    assert torch.allclose(ours, expected.to(torch.float64), rtol=1e-6, atol=0)
    plain = _float_inverse_frequencies(64, 500000.0)
    assert torch.allclose(ours[:4], plain[:4], rtol=1e-12)  # short wavelengths kept
    assert torch.allclose(ours[-4:], plain[-4:] / 32, rtol=1e-12)  # long wavelengths ÷ factor


def test_linear_and_dynamic_scaling_follow_vllm() -> None:
    linear = ExactConfig.from_hf({**LLAMA, "rope_scaling": {"rope_type": "linear", "factor": 4.0}})
    ours = _ours(16, 10000.0, linear.rope_scaling)
    assert torch.allclose(ours, _float_inverse_frequencies(16, 10000.0) / 4, rtol=1e-14)
    raw = {**LLAMA, "max_position_embeddings": 4096,
           "rope_scaling": {"rope_type": "dynamic", "factor": 2.0, "max_trained_positions": 2048}}
    dynamic = ExactConfig.from_hf(raw)
    base = 10000.0 * ((2.0 * 4096 / 2048) - (2.0 - 1)) ** (16 / (16 - 2))
    ours = _ours(16, 10000.0, dynamic.rope_scaling)
    assert torch.allclose(ours, _float_inverse_frequencies(16, base), rtol=1e-13)
    untrained = ExactConfig.from_hf({**raw, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})
    assert rope_tables(16, 10000.0, 8, untrained.rope_scaling)[0].tolist() == rope_tables(16, 10000.0, 8)[0].tolist()


def _float_logits(raw: dict[str, Any], weights: dict[str, torch.Tensor], tokens: list[int]) -> torch.Tensor:
    """The Llama network in plain float64 with every bias the config names (no quantisation)."""
    w = {k: v.to(torch.float64) for k, v in weights.items()}
    heads, dim = raw["num_attention_heads"], raw["hidden_size"] // raw["num_attention_heads"]
    n, half = len(tokens), dim // 2
    angles = torch.arange(n, dtype=torch.float64)[:, None] * _float_inverse_frequencies(dim, raw["rope_theta"])
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]

    def norm(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + raw["rms_norm_eps"]) * g

    def lin(x: torch.Tensor, name: str) -> torch.Tensor:
        return x @ w[name + ".weight"].T + w.get(name + ".bias", torch.zeros(()))

    def rope(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x[..., :half] * cos - x[..., half:] * sin, x[..., half:] * cos + x[..., :half] * sin], -1)

    x = w["model.embed_tokens.weight"][tokens]
    for i in range(raw["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = norm(x, w[p + "input_layernorm.weight"])
        q = rope(lin(h, p + "self_attn.q_proj").view(n, heads, dim))
        k = rope(lin(h, p + "self_attn.k_proj").view(n, heads, dim))
        v = lin(h, p + "self_attn.v_proj").view(n, heads, dim)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(dim)
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
        x = x + lin(torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, -1), p + "self_attn.o_proj")
        h = norm(x, w[p + "post_attention_layernorm.weight"])
        x = x + lin(torch.nn.functional.silu(lin(h, p + "mlp.gate_proj")) * lin(h, p + "mlp.up_proj"),
                    p + "mlp.down_proj")
    return norm(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


def test_attention_output_and_mlp_biases_are_applied() -> None:
    raw = {**LLAMA, "attention_bias": True, "mlp_bias": True}
    weights = random_weights(raw, seed=3)
    assert "model.layers.0.self_attn.o_proj.bias" in weights and "model.layers.0.mlp.down_proj.bias" in weights
    config = ExactConfig.from_hf(raw)
    assert (config.qkv_bias, config.o_bias, config.mlp_bias) == (True, True, True)
    model = ExactLlama(config, weights, 64)
    tokens = list(range(5, 45))
    exact = model.logits(model.prefill([tokens])).to(torch.float64) / 2**16
    reference = _float_logits(raw, weights, tokens)
    assert (exact - reference).abs().max() < 0.25
    unbiased = {k: v for k, v in weights.items() if not k.endswith(("o_proj.bias", "mlp.down_proj.bias"))}
    unbiased |= {k: torch.zeros_like(v) for k, v in weights.items() if k.endswith(("o_proj.bias", "down_proj.bias"))}
    without = ExactLlama(config, unbiased, 64)
    assert not torch.equal(without.logits(without.prefill([tokens])), model.logits(model.prefill([tokens])))


def test_a_qwen2_checkpoint_has_no_output_bias() -> None:
    config = ExactConfig.from_hf({**CONFIGS["qwen2-gqa2-bias"], "attention_bias": True})
    assert (config.qkv_bias, config.o_bias) == (True, False)


def test_a_weight_the_exact_path_would_not_read_is_refused_by_name() -> None:
    weights = random_weights(LLAMA) | {"model.layers.1.self_attn.o_proj.bias": torch.zeros(48, dtype=torch.bfloat16)}
    with pytest.raises(UnsupportedModelError, match=r"model\.layers\.1\.self_attn\.o_proj\.bias"):
        ExactLlama(ExactConfig.from_hf(LLAMA), weights, 64)


@pytest.mark.parametrize(("extra", "reason"), [
    ({"architectures": ["MistralForCausalLM"], "sliding_window": 4096, "max_position_embeddings": 32768},
     "sliding-window attention"),
    ({"sliding_window": 1024, "use_sliding_window": True, "max_position_embeddings": 32768}, "sliding_window=1024"),
    ({"layer_types": ["sliding_attention", "full_attention", "full_attention"]}, "sliding_attention"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
    ({"rope_scaling": {"rope_type": "dynamic", "alpha": 2.0}}, "without a factor"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
])
def test_unsupported_attention_is_refused_with_the_reason(extra: dict[str, Any], reason: str) -> None:
    with pytest.raises(UnsupportedModelError, match=reason):
        ExactConfig.from_hf({**LLAMA, **extra})


@pytest.mark.parametrize("extra", [
    {"sliding_window": 4096, "use_sliding_window": False, "max_position_embeddings": 32768},
    {"sliding_window": 32768, "max_position_embeddings": 32768},
    {"sliding_window": None},
    {"layer_types": ["full_attention"] * 3},
])
def test_a_window_that_never_applies_is_accepted(extra: dict[str, Any]) -> None:
    assert ExactConfig.from_hf({**LLAMA, **extra}).num_layers == 3
