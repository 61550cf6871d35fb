"""A Llama-family forward pass whose integer logits do not depend on batch, path, threads, ISA or device.

Why it is exact (the argument the codec's portability rests on):

- **Every reduction sums integers** whose partial sums provably stay below the float format's
  exact-integer limit, so any summation order — any BLAS kernel, blocking, thread count, SIMD
  width, batch shape or device — gives the same bits:

  * linear layers: int8 weights (per output channel, from the checkpoint) × int8 activations
    (per token) in float32 GEMMs, reductions split into pieces of at most 1,040 terms so every
    partial sum stays below 2**24 (127·127·1040 < 2**24); the pieces are added in float64;
  * the output layer: int8 weights × int16 activations in float64 (32767·127·K < 2**53);
  * attention: queries, keys and values on fixed grids (2**-10) with clamped magnitudes, and
    table-driven integer attention weights (≤ 2**16), both products in float64 with bounds
    checked at load time for the longest context;
  * RMSNorm's sum of squares: of the row re-scaled to int16 integers.
- **Every other operation is elementwise**: a single IEEE-754 binary64 ``+ − × ÷ √`` (correctly
  rounded by the standard on every conforming CPU and GPU, each its own kernel so nothing is fused
  into an FMA), ``round``/``floor``, ``max``/``abs``, or an integer-indexed table lookup.
- **No transcendental function runs**: exp (softmax), sigmoid (SiLU) and RoPE's cos/sin come from
  ``tables``, built with ``decimal``/integer arithmetic.

A token's row therefore depends only on its own inputs and on exact sums, so the same text gives
bit-identical logits in prefill and in decode steps, alone or among other rows.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cascade.codec.exact import tables

NUMERICS_VERSION = "exact-llama-1"
LOGIT_FRACTION_BITS = 16
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
_ACT8 = 127.0
_ACT16 = 32767.0
_FP32_EXACT = 1 << 24
_FP64_EXACT = 1 << 53
_QK_BITS = 10
_V_BITS = 10
_QUERY_BLOCK = 128
_MASKED = -float(1 << 60)


_RINT_MAGIC = 1.5 * 2.0**52
_RINT_LIMIT = 2.0**50


def rint(x: torch.Tensor) -> torch.Tensor:
    """Round half to even, as ``torch.round`` but an order of magnitude faster on CPU: adding and
    subtracting 1.5·2**52 leaves the nearest integer (IEEE round-to-nearest-even), exactly, for
    |x| < 2**51; inputs are clamped to ±2**50 first, far beyond any value the model produces."""
    return rint_(x.clamp(-_RINT_LIMIT, _RINT_LIMIT))


def rint_(x: torch.Tensor) -> torch.Tensor:
    """``rint`` in place, for values the caller knows lie within ±2**50."""
    return x.add_(_RINT_MAGIC).sub_(_RINT_MAGIC)


class UnsupportedModelError(ValueError):
    """The checkpoint is not one the exact path can run (named in the message)."""


@dataclass(frozen=True)
class ExactConfig:
    """The parts of a Hugging Face config the exact forward pass uses."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_linear_factor: float
    tie_word_embeddings: bool
    attention_bias: bool

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> ExactConfig:
        arch = (raw.get("architectures") or ["?"])[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(f"the exact codec runs Llama-family checkpoints {SUPPORTED_ARCHITECTURES}; "
                                        f"this model is {arch}")
        if raw.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"hidden_act {raw.get('hidden_act')!r} is not supported (only silu)")
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "linear"):
            raise UnsupportedModelError(f"RoPE type {rope_type!r} is not supported (default, linear)")
        theta = float(rope.get("rope_theta", raw.get("rope_theta", 10000.0)))
        heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        return cls(vocab_size=int(raw["vocab_size"]), hidden_size=hidden,
                   intermediate_size=int(raw["intermediate_size"]), num_layers=int(raw["num_hidden_layers"]),
                   num_heads=heads, num_kv_heads=int(raw.get("num_key_value_heads") or heads),
                   head_dim=int(raw.get("head_dim") or hidden // heads),
                   rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)), rope_theta=theta,
                   rope_linear_factor=float(rope.get("factor", 1.0)) if rope_type == "linear" else 1.0,
                   tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                   attention_bias=arch == "Qwen2ForCausalLM" or bool(raw.get("attention_bias", False)))


class QuantLinear:
    """``y ≈ x Wᵀ (+ b)`` with int8 weights per output channel and per-token activation integers."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, act_max: float) -> None:
        w = weight.to(torch.float64)
        amax = w.abs().amax(dim=1)
        amax = torch.where(amax > 0, amax, torch.ones_like(amax))
        self.out_features, self.in_features = w.shape
        self.act_max = act_max
        self.scale = amax / _ACT8
        q = rint(w * _ACT8 / amax[:, None])
        bound = act_max * _ACT8
        if bound * self.in_features < _FP32_EXACT:
            self.dtype, self.pieces = torch.float32, [(0, self.in_features)]
        elif act_max == _ACT8:
            step = int((_FP32_EXACT - 1) // bound)
            self.dtype = torch.float32
            self.pieces = [(i, min(i + step, self.in_features)) for i in range(0, self.in_features, step)]
        else:
            if bound * self.in_features >= _FP64_EXACT:
                raise UnsupportedModelError(f"a {self.in_features}-term reduction is too long for exact float64 sums")
            self.dtype, self.pieces = torch.float64, [(0, self.in_features)]
        self.weight_t = [q[:, a:b].t().contiguous().to(self.dtype) for a, b in self.pieces]
        self.bias = None if bias is None else bias.to(torch.float64)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        amax = x.abs().amax(dim=1, keepdim=True)
        step = torch.where(amax > 0, amax, torch.ones_like(amax)) / self.act_max
        m = rint_(x / step).to(self.dtype)  # |x / step| ≤ act_max
        acc: torch.Tensor | None = None
        for (a, b), w in zip(self.pieces, self.weight_t, strict=True):
            part = (m[:, a:b] @ w).to(torch.float64)
            acc = part if acc is None else acc + part
        assert acc is not None
        y = acc * (step * self.scale[None, :])
        return y if self.bias is None else y + self.bias


def rms_norm(x: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm whose mean square is an exact sum (of the row scaled to int16 integers)."""
    amax = x.abs().amax(dim=1, keepdim=True)
    amax = torch.where(amax > 0, amax, torch.ones_like(amax))
    step = amax / _ACT16
    xi = rint(x / step)
    mean_square = (xi * xi).sum(dim=1, keepdim=True) / x.shape[1] * (step * step)
    return x / torch.sqrt(mean_square + eps) * gain


def silu(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``x · sigmoid(x)`` with sigmoid read from the exact table at the nearest grid point."""
    half = tables.SIG_RANGE << tables.SIG_GRID_BITS
    index = rint(x * float(1 << tables.SIG_GRID_BITS)).clamp_(-half, half).to(torch.int64) + half
    return x * table[index]


@dataclass
class KVCache:
    """Per layer: keys and values (fixed-point integers held in float64), (rows, kv_heads, length, head_dim)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    lengths: torch.Tensor

    @classmethod
    def allocate(cls, rows: int, length: int, layers: int, kv_heads: int, head_dim: int) -> KVCache:
        shape = (rows, kv_heads, length, head_dim)
        return cls([torch.zeros(shape, dtype=torch.float64) for _ in range(layers)],
                   [torch.zeros(shape, dtype=torch.float64) for _ in range(layers)],
                   torch.zeros(rows, dtype=torch.int64))

    def keep(self, rows: torch.Tensor) -> None:
        """Drop every row not in ``rows`` (finished sequences), so steps touch only live ones."""
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]
        self.lengths = self.lengths[rows]


class ExactLlama:
    """The exact forward pass: ``prefill`` (whole sequences) and ``step`` (one token per cached row)."""

    def __init__(self, config: ExactConfig, weights: dict[str, torch.Tensor], max_positions: int) -> None:
        self.config = config
        self.max_positions = max_positions
        c = config
        self.embed = weights["model.embed_tokens.weight"].to(torch.float64)
        self.layers: list[dict[str, Any]] = []
        for i in range(c.num_layers):
            p = f"model.layers.{i}."

            def linear(name: str, act: float = _ACT8, bias: bool = False, prefix: str = p) -> QuantLinear:
                return QuantLinear(weights[prefix + name + ".weight"],
                                   weights.get(prefix + name + ".bias") if bias else None, act)

            self.layers.append({
                "attn_norm": weights[p + "input_layernorm.weight"].to(torch.float64),
                "mlp_norm": weights[p + "post_attention_layernorm.weight"].to(torch.float64),
                "q": linear("self_attn.q_proj", bias=c.attention_bias),
                "k": linear("self_attn.k_proj", bias=c.attention_bias),
                "v": linear("self_attn.v_proj", bias=c.attention_bias),
                "o": linear("self_attn.o_proj"), "gate": linear("mlp.gate_proj"), "up": linear("mlp.up_proj"),
                "down": linear("mlp.down_proj")})
        self.final_norm = weights["model.norm.weight"].to(torch.float64)
        head = weights["model.embed_tokens.weight"] if c.tie_word_embeddings else weights["lm_head.weight"]
        self.lm_head = QuantLinear(head, None, _ACT16)
        cos, sin = tables.rope_tables(c.head_dim, c.rope_theta, max_positions, c.rope_linear_factor)
        self.cos = torch.from_numpy(cos)
        self.sin = torch.from_numpy(sin)
        self.att_exp = torch.from_numpy(tables.attention_exp_table())
        self.sigmoid = torch.from_numpy(tables.sigmoid_table())
        # |p| ≤ 2**16 times |v| over max_positions terms must stay below 2**53.
        self.v_limit = float(min(1 << 40, (_FP64_EXACT - 1) // ((1 << tables.ATT_ONE_BITS) * max_positions)))
        self.qk_limit = float(min(1 << 40, math.isqrt((_FP64_EXACT - 1) // c.head_dim)))
        self.score_to_grid = float(1 << tables.ATT_GRID_BITS) / (float(1 << (2 * _QK_BITS)) * math.sqrt(c.head_dim))

    @classmethod
    def from_pretrained(cls, path: str | Path, max_positions: int) -> ExactLlama:
        from safetensors.torch import load_file

        root = Path(path)
        config = ExactConfig.from_hf(json.loads((root / "config.json").read_text()))
        weights: dict[str, torch.Tensor] = {}
        files = sorted(root.glob("*.safetensors"))
        if not files:
            raise UnsupportedModelError(f"no .safetensors weights in {root}")
        for file in files:
            weights.update(load_file(str(file)))
        return cls(config, weights, max_positions)

    # -- pieces -----------------------------------------------------------------------------------
    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate-half RoPE of ``x`` (tokens, heads, head_dim), then onto the 2**-10 grid, clamped."""
        half = self.config.head_dim // 2
        cos = self.cos[positions][:, None, :]
        sin = self.sin[positions][:, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        a = x1 * cos
        b = x2 * sin
        c = x2 * cos
        d = x1 * sin
        rotated = torch.cat([a - b, c + d], dim=-1)
        return rint(rotated * float(1 << _QK_BITS)).clamp_(-self.qk_limit, self.qk_limit)

    def _values(self, v: torch.Tensor) -> torch.Tensor:
        return rint(v * float(1 << _V_BITS)).clamp_(-self.v_limit, self.v_limit)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, invalid: torch.Tensor | None) -> torch.Tensor:
        """q (…, Lq, D), k/v (…, Lk, D) fixed-point integers; ``invalid`` (broadcastable to the scores'
        last ``invalid.shape[-1]`` keys) marks keys a query must not see. Returns (…, Lq, D).

        Masked scores become −2**60 (below any real score, |score| < 2**53), so their index saturates
        at the table's last entry, 0."""
        scores = q @ k.transpose(-1, -2)
        if invalid is not None:
            scores[..., -invalid.shape[-1]:].masked_fill_(invalid, _MASKED)
        top = scores.amax(dim=-1, keepdim=True)
        last = float(self.att_exp.shape[0] - 1)
        index = rint_(torch.sub(top, scores, out=scores).mul_(self.score_to_grid).clamp_(max=last))
        p = self.att_exp[index.to(torch.int64)]
        return (p @ v) / (p.sum(dim=-1, keepdim=True) * float(1 << _V_BITS))

    def _causal(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal self-attention of one sequence, (heads, L, D), in query blocks that see only their prefix."""
        n = q.shape[1]
        out = torch.empty_like(q)
        for a in range(0, n, _QUERY_BLOCK):
            b = min(n, a + _QUERY_BLOCK)
            invalid = torch.ones(b - a, b - a, dtype=torch.bool).triu_(1)
            out[:, a:b] = self._attend(q[:, a:b], k[:, :b], v[:, :b], invalid)
        return out

    def _mlp(self, layer: dict[str, Any], x: torch.Tensor) -> torch.Tensor:
        h = rms_norm(x, layer["mlp_norm"], self.config.rms_norm_eps)
        return layer["down"](silu(layer["gate"](h), self.sigmoid) * layer["up"](h))

    def _qkv(self, layer: dict[str, Any], x: torch.Tensor, positions: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c = self.config
        h = rms_norm(x, layer["attn_norm"], c.rms_norm_eps)
        n = x.shape[0]
        q = self._rope(layer["q"](h).view(n, c.num_heads, c.head_dim), positions)
        k = self._rope(layer["k"](h).view(n, c.num_kv_heads, c.head_dim), positions)
        v = self._values(layer["v"](h).view(n, c.num_kv_heads, c.head_dim))
        return q, k, v

    def _expand(self, kv: torch.Tensor) -> torch.Tensor:
        """(…, kv_heads, L, D) → (…, heads, L, D) for grouped-query attention."""
        group = self.config.num_heads // self.config.num_kv_heads
        return kv if group == 1 else kv.repeat_interleave(group, dim=-3)

    # -- passes -----------------------------------------------------------------------------------
    def prefill(self, sequences: list[list[int]], cache: KVCache | None = None,
                rows: list[int] | None = None) -> torch.Tensor:
        """Final hidden states of every position of every sequence, packed ``(Σ len, hidden)``.

        With ``cache``, sequence ``i`` is written to cache row ``rows[i]`` (its positions 0…len-1).
        """
        c = self.config
        lengths = [len(s) for s in sequences]
        if min(lengths) < 1 or max(lengths) > self.max_positions:
            raise ValueError(f"sequences must hold 1…{self.max_positions} tokens")
        tokens = torch.tensor([t for s in sequences for t in s], dtype=torch.int64)
        positions = torch.cat([torch.arange(n) for n in lengths])
        x = self.embed[tokens]
        for li, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, positions)
            out = torch.empty(x.shape[0], c.num_heads, c.head_dim, dtype=torch.float64)
            start = 0
            for si, n in enumerate(lengths):
                qs, ks, vs = (t[start:start + n].transpose(0, 1) for t in (q, k, v))
                out[start:start + n] = self._causal(qs, self._expand(ks), self._expand(vs)).transpose(0, 1)
                if cache is not None and rows is not None:
                    cache.keys[li][rows[si], :, :n] = ks
                    cache.values[li][rows[si], :, :n] = vs
                start += n
            x = x + layer["o"](out.reshape(x.shape[0], -1))
            x = x + self._mlp(layer, x)
        if cache is not None and rows is not None:
            cache.lengths[torch.tensor(rows)] = torch.tensor(lengths)
        return x

    def step(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One token for every cache row at its next position; returns final hidden states."""
        positions = cache.lengths
        span = int(positions.max()) + 1
        if span > cache.keys[0].shape[2]:
            raise ValueError("a row's cache is full")
        invalid = (torch.arange(span)[None, :] > positions[:, None])[:, None, None, :]
        x = self.embed[tokens]
        n = x.shape[0]
        at = torch.arange(n)
        for li, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, positions)
            cache.keys[li][at, :, positions] = k
            cache.values[li][at, :, positions] = v
            keys = self._expand(cache.keys[li][:, :, :span])
            values = self._expand(cache.values[li][:, :, :span])
            out = self._attend(q[:, :, None, :], keys, values, invalid)
            x = x + layer["o"](out.reshape(n, -1))
            x = x + self._mlp(layer, x)
        cache.lengths = positions + 1
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Integer logits in units of 2**-16 (int64), from final hidden states."""
        h = rms_norm(hidden, self.final_norm, self.config.rms_norm_eps)
        return rint(self.lm_head(h) * float(1 << LOGIT_FRACTION_BITS)).to(torch.int64)
