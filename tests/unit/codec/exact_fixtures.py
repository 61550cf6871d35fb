"""A tiny random-weight Llama (GQA, untied head, attention bias) for fast exact-path tests."""

from __future__ import annotations

import functools
from typing import Any

import torch
from cascade.codec.exact.model import ExactConfig, ExactLlama

TINY = {"architectures": ["Qwen2ForCausalLM"], "vocab_size": 300, "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu"}


def tiny_weights(config: dict[str, Any], seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    head_dim = h // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head_dim

    def rand(*shape: int, scale: float = 0.08) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * scale).to(torch.bfloat16)

    weights = {"model.embed_tokens.weight": rand(v, h, scale=1.0), "model.norm.weight": 1 + rand(h),
               "lm_head.weight": rand(v, h, scale=0.3)}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        weights |= {p + "input_layernorm.weight": 1 + rand(h), p + "post_attention_layernorm.weight": 1 + rand(h),
                    p + "self_attn.q_proj.weight": rand(h, h), p + "self_attn.k_proj.weight": rand(kv, h),
                    p + "self_attn.v_proj.weight": rand(kv, h), p + "self_attn.o_proj.weight": rand(h, h),
                    p + "self_attn.q_proj.bias": rand(h), p + "self_attn.k_proj.bias": rand(kv),
                    p + "self_attn.v_proj.bias": rand(kv), p + "mlp.gate_proj.weight": rand(i, h),
                    p + "mlp.up_proj.weight": rand(i, h), p + "mlp.down_proj.weight": rand(h, i)}
    return weights


@functools.cache
def tiny_model(max_positions: int = 128) -> ExactLlama:
    return ExactLlama(ExactConfig.from_hf(TINY), tiny_weights(TINY), max_positions)
