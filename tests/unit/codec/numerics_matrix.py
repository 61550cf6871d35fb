"""The exact model's test matrix and a recorder of everything ``exact-llama-1`` decides on it.

``record(model)`` runs packed prefill of several sequences (one longer than a query block), then
decode steps through a ``KVCache`` (dropping a row half way), and returns sha256 digests of the
final hidden states (float64), the int64 logits and the frequency tables. The digests in
``exact_llama_1_digests.json`` were recorded with the code of the release that introduced
``exact-llama-1`` (commit ddd10e1: ``PYTHONPATH=<that checkout>/service:. python -m
tests.unit.codec.numerics_matrix``). Any later implementation must reproduce the integer digests
(logits, ids, CDFs) bit for bit, or containers that release wrote stop decoding. The float64 hidden
states depend on RMSNorm's square root, which that release took from torch (MKL's, another variant
on some machines: ``codec.exact.root``); the model now computes with the correctly rounded root, the
same everywhere, so the hidden digests (re-recorded that way on 2026-11-25, the integers unchanged)
pin every operation on any host, and ``record(model, machine_root=True)`` checks the integers under
this machine's torch root, the one earlier releases computed with here. Regenerate the integers only
together with a new numerics version.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from cascade.codec.exact import fused, root
from cascade.codec.exact.cache import KVCache
from cascade.codec.exact.frequencies import frequency_tables
from cascade.codec.exact.model import ExactConfig, ExactLlama
from torch.utils._python_dispatch import _disable_current_modes

REPO = Path(__file__).resolve().parents[3]
PYCODER = REPO / "models" / "pycoder-23m"
DIGESTS = Path(__file__).with_name("exact_llama_1_digests.json")
needs_compiled = pytest.mark.skipif(not fused.usable(torch.device("cpu")),
                                    reason="the compiled kernels do not run on this host")
MAX_POSITIONS = 320

# Random-weight configurations that cover every branch of the forward pass: grouped-query
# attention (group 2 and 4), attention biases, tied and untied heads, a head_dim that is not
# hidden/heads, linear RoPE scaling, and an MLP wider than one float32 GEMM piece (1,040 terms).
CONFIGS: dict[str, dict[str, Any]] = {
    "qwen2-gqa2-bias": {"architectures": ["Qwen2ForCausalLM"], "vocab_size": 300, "hidden_size": 64,
                        "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
                        "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                        "tie_word_embeddings": False, "hidden_act": "silu"},
    "llama-gqa4-tied-linear": {"architectures": ["LlamaForCausalLM"], "vocab_size": 257, "hidden_size": 96,
                               "intermediate_size": 1100, "num_hidden_layers": 2, "num_attention_heads": 8,
                               "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-5,
                               "rope_theta": 500000.0, "tie_word_embeddings": True, "hidden_act": "silu",
                               "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    "llama-mha": {"architectures": ["LlamaForCausalLM"], "vocab_size": 200, "hidden_size": 48,
                  "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 3,
                  "num_key_value_heads": 3, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                  "tie_word_embeddings": False, "hidden_act": "silu"},
}


def random_weights(config: dict[str, Any], seed: int = 0) -> dict[str, torch.Tensor]:
    """bf16 random weights for ``config``: q/k/v biases only for Qwen2 or ``attention_bias``
    (drawn always, so the draws — and the recorded digests — do not depend on the flags), plus
    o_proj's for a Llama ``attention_bias`` and the MLP's for ``mlp_bias``."""
    generator = torch.Generator().manual_seed(seed)
    h, inter, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or h // heads
    q, kv = heads * head_dim, kv_heads * head_dim

    def rand(*shape: int, scale: float = 0.08) -> torch.Tensor:
        """Uniform with standard deviation ``scale``, from integer draws: ``torch.randn`` is not
        portable (its vectorised Box-Muller differs between ATen CPU capabilities), these are."""
        draws = torch.randint(-(1 << 12), 1 << 12, shape, generator=generator).to(torch.float32)
        return (draws * (scale * math.sqrt(3.0) / (1 << 12))).to(torch.bfloat16)

    weights = {"model.embed_tokens.weight": rand(v, h, scale=1.0), "model.norm.weight": 1 + rand(h)}
    if not config["tie_word_embeddings"]:
        weights["lm_head.weight"] = rand(v, h, scale=0.3)
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        weights |= {p + "input_layernorm.weight": 1 + rand(h), p + "post_attention_layernorm.weight": 1 + rand(h),
                    p + "self_attn.q_proj.weight": rand(q, h), p + "self_attn.k_proj.weight": rand(kv, h),
                    p + "self_attn.v_proj.weight": rand(kv, h), p + "self_attn.o_proj.weight": rand(h, q),
                    p + "self_attn.q_proj.bias": rand(q), p + "self_attn.k_proj.bias": rand(kv),
                    p + "self_attn.v_proj.bias": rand(kv), p + "mlp.gate_proj.weight": rand(inter, h),
                    p + "mlp.up_proj.weight": rand(inter, h), p + "mlp.down_proj.weight": rand(h, inter)}
    qwen = config["architectures"] == ["Qwen2ForCausalLM"]
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        if not (qwen or config.get("attention_bias")):
            for name in ("q_proj", "k_proj", "v_proj"):
                del weights[p + f"self_attn.{name}.bias"]
        if config.get("attention_bias") and not qwen:
            weights[p + "self_attn.o_proj.bias"] = rand(h)
        if config.get("mlp_bias"):
            weights |= {p + "mlp.gate_proj.bias": rand(inter), p + "mlp.up_proj.bias": rand(inter),
                        p + "mlp.down_proj.bias": rand(h)}
    return weights


@functools.cache
def random_model(name: str, **kwargs: Any) -> ExactLlama:
    config = CONFIGS[name]
    return ExactLlama(ExactConfig.from_hf(config), random_weights(config), MAX_POSITIONS, **kwargs)


@functools.cache
def pycoder(**kwargs: Any) -> ExactLlama:
    return ExactLlama.from_pretrained(PYCODER, MAX_POSITIONS, **kwargs)


def model_names() -> list[str]:
    return ["pycoder-23m", *CONFIGS]


def load(name: str, **kwargs: Any) -> ExactLlama:
    return pycoder(**kwargs) if name == "pycoder-23m" else random_model(name, **kwargs)


def digest(tensor: torch.Tensor) -> str:
    """sha256 of the tensor's bytes, taken outside any op audit: copying a GPU tensor to the host to hash
    it is the harness's step, not the model's (under ``OpAudit("cuda")`` its host ops were flagged)."""
    with _disable_current_modes():
        return hashlib.sha256(tensor.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


def workload(vocab: int) -> tuple[list[list[int]], list[list[int]]]:
    """Prefill sequences (lengths 1…300, one past a 128-query block boundary twice) and decode
    sequences (prefix lengths differ; every one continues 24 tokens)."""
    rng = random.Random(21)
    prefill = [[rng.randrange(vocab) for _ in range(n)] for n in (1, 7, 129, 300, 40)]
    decode = [[rng.randrange(vocab) for _ in range(n + 24)] for n in (3, 60, 1, 150)]
    return prefill, decode


def record(model: ExactLlama, machine_root: bool = False) -> dict[str, str]:
    """Digests of hidden states, logits and frequency tables over ``workload`` (with this machine's
    torch root when ``machine_root``)."""
    if machine_root:
        with root.machine():
            return record(model)
    c = model.config
    prefill, decode = workload(c.vocab_size)
    out: dict[str, str] = {}
    hidden = model.prefill(prefill)
    logits = model.logits(hidden)
    out["prefill.hidden"] = digest(hidden)
    out["prefill.logits"] = digest(logits)
    ids, cdf = frequency_tables(logits, min(64, c.vocab_size - 1), 32)
    out["prefill.ids"], out["prefill.cdf"] = digest(ids), digest(cdf)
    prefixes = [len(s) - 24 for s in decode]
    device = getattr(model, "device", None)  # the release that recorded the digests had no device argument
    cache = KVCache.allocate(len(decode), max(len(s) for s in decode), c.num_layers, c.num_kv_heads, c.head_dim,
                             **({} if device is None else {"device": device}))
    hidden = model.prefill([s[:n] for s, n in zip(decode, prefixes, strict=True)], cache, list(range(len(decode))))
    on = hidden.device  # every tensor the harness makes lives where the model computes (the CUDA audit)
    ends = torch.tensor(prefixes, device=on).cumsum(0) - 1
    rows = [model.logits(hidden[ends])]
    hiddens = [hidden]
    live = list(range(len(decode)))
    for t in range(24):
        if t == 12:
            live = [0, 2, 3]
            cache.keep(torch.tensor([0, 2, 3], device=on))
        tokens = torch.tensor([decode[i][prefixes[i] + t] for i in live], device=on)
        hidden = model.step(tokens, cache)
        hiddens.append(hidden)
        rows.append(model.logits(hidden))
    out["decode.hidden"] = digest(torch.cat(hiddens))
    out["decode.logits"] = digest(torch.cat(rows))
    return out


def record_all() -> dict[str, dict[str, str]]:
    return {name: record(load(name)) for name in model_names()}


if __name__ == "__main__":
    print(json.dumps(record_all(), indent=1, sort_keys=True))
