"""A Llama-family forward pass whose integer logits do not depend on batch, path, threads, ISA or device.

Why it is exact (the argument the codec's portability rests on):

- **Every reduction sums integers** whose partial sums provably stay below the float format's
  exact-integer limit, so any summation order — any BLAS kernel, blocking, thread count, SIMD
  width, batch shape or device — gives the same bits:

  * linear layers: int8 weights (per output channel, from the checkpoint) × int8 activations
    (per token) in float32 GEMMs, reductions split into pieces of at most 1,040 terms so every
    partial sum stays below 2**24 (127·127·1040 < 2**24); the pieces are added in float64;
  * the output layer: int8 weights × int16 activations, split as ``hi·2**8 + lo`` (both ≤ 128 in
    magnitude) into two float32 products per piece of ≤ 1,032 terms (128·127·1032 < 2**24),
    recombined in float64 — the same integer sum a float64 GEMM gives (32767·127·K < 2**53);
  * attention: queries, keys and values on fixed grids (2**-10) with clamped magnitudes, and
    table-driven integer attention weights (≤ 2**16), both products in float64 with bounds
    checked at load time for the longest context;
  * RMSNorm's sum of squares: of the row re-scaled to int16 integers.
- **Every other operation is elementwise**: a single IEEE-754 binary64 ``+ − × ÷`` (correctly
  rounded by the standard on every conforming CPU and GPU, never fused into an FMA), RMSNorm's
  square root (torch's CPU ``sqrt``, which ``exact-llama-1`` is defined by: MKL's, within an ulp of
  the correctly rounded root; on other devices the per-row roots are taken on the host —
  ``exact_root``, docs/architecture.md, "The square root"), ``round``/``floor``,
  ``max``/``abs``, or an integer-indexed table lookup.
- **No transcendental function runs**: exp (softmax), sigmoid (SiLU) and RoPE's cos/sin come from
  ``tables``, built with ``decimal``/integer arithmetic.

A token's row therefore depends only on its own inputs and on exact sums, so the same text gives
bit-identical logits in prefill and in decode steps, alone or among other rows, on any device.

Storage is integer-native: linear weights int8, the embedding in the checkpoint's dtype (its rows
become float64 exactly), the KV cache int32. Linear layers run on the host's int8 GEMM where a
load-time probe shows it sums exactly (``int8_gemm``), else as the float32 pieces above; decode
attention reads the int32 cache directly (``cache_products``) — the same sums either way — and on
the CPU the elementwise chains between the GEMMs run as compiled loops of the same operations in
the same order (``fused``). Every
aten op the decision path runs is on the reviewed allow-list in ``audit`` (CI fails otherwise), and
``known_answer`` digests the pre-rounding intermediates to catch arithmetic drift at start-up.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import torch

from cascade.codec.exact import cache_products, fused, root, tables
from cascade.codec.exact.int8_gemm import int8_gemm_is_exact, int8_matmul

P = ParamSpec("P")
R = TypeVar("R")
NUMERICS_VERSION = "exact-llama-1"
KERNELS = ("fast", "reference")
LOGIT_FRACTION_BITS = 16
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
_ACT8 = 127.0
_ACT16 = 32767.0
_FP32_EXACT = 1 << 24
_FP64_EXACT = 1 << 53
_QK_BITS = 10
_V_BITS = 10
_QUERY_BLOCK = 128
_SCORE_ELEMENTS = 1 << 22
_KV_BLOCK_ELEMENTS = 1 << 18
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
    rope_scaling: tables.RopeScaling
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool = False
    mlp_bias: bool = False

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> ExactConfig:
        arch = (raw.get("architectures") or ["?"])[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(f"the exact codec runs Llama-family checkpoints {SUPPORTED_ARCHITECTURES}; "
                                        f"this model is {arch}")
        if raw.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"hidden_act {raw.get('hidden_act')!r} is not supported (only silu)")
        _refuse_sliding_window(raw)
        if float(raw.get("partial_rotary_factor", 1.0)) != 1.0:
            raise UnsupportedModelError(f"partial_rotary_factor {raw['partial_rotary_factor']} is not supported "
                                        "(RoPE over the whole head only)")
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        theta = float(rope.get("rope_theta", raw.get("rope_theta", 10000.0)))
        heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        qwen = arch == "Qwen2ForCausalLM"
        attention_bias = bool(raw.get("attention_bias", False))
        return cls(vocab_size=int(raw["vocab_size"]), hidden_size=hidden,
                   intermediate_size=int(raw["intermediate_size"]), num_layers=int(raw["num_hidden_layers"]),
                   num_heads=heads, num_kv_heads=int(raw.get("num_key_value_heads") or heads),
                   head_dim=int(raw.get("head_dim") or hidden // heads),
                   rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)), rope_theta=theta,
                   rope_scaling=_rope_scaling(rope, raw),
                   tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                   qkv_bias=qwen or attention_bias, o_bias=attention_bias and not qwen,
                   mlp_bias=bool(raw.get("mlp_bias", False)))


def _rope_scaling(rope: dict[str, Any], raw: dict[str, Any]) -> tables.RopeScaling:
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", "linear", "dynamic", "llama3"):
        raise UnsupportedModelError(f"RoPE type {kind!r} is not supported (default, linear, dynamic, llama3)")
    if kind == "default":
        return tables.RopeScaling()
    if "factor" not in rope:
        raise UnsupportedModelError(f"RoPE type {kind!r} without a factor is not supported")
    factor = float(rope["factor"])
    longest = int(raw.get("max_position_embeddings") or 0)
    if kind == "llama3":
        return tables.RopeScaling("llama3", factor, float(rope.get("low_freq_factor", 1.0)),
                                  float(rope.get("high_freq_factor", 4.0)),
                                  int(rope["original_max_position_embeddings"]))
    if kind == "dynamic":
        if not longest:
            raise UnsupportedModelError("dynamic RoPE scaling needs max_position_embeddings")
        return tables.RopeScaling("dynamic", factor, original_max_positions=int(rope.get("max_trained_positions",
                                                                                          longest)),
                                  max_positions=longest)
    return tables.RopeScaling(kind, factor)


def _refuse_sliding_window(raw: dict[str, Any]) -> None:
    """Sliding-window attention changes which keys a query sees; the exact path attends to the whole
    context, so such a checkpoint would run as a different model: refuse it with the reason."""
    window = raw.get("sliding_window")
    sliding_layers = [t for t in raw.get("layer_types") or [] if t != "full_attention"]
    if sliding_layers:
        raise UnsupportedModelError(f"layer types {sorted(set(sliding_layers))} are not supported "
                                    "(the exact codec runs full attention only)")
    if window is None or raw.get("use_sliding_window", True) is False:
        return
    limit = raw.get("max_position_embeddings")
    if limit is None or int(window) < int(limit):
        raise UnsupportedModelError(f"sliding-window attention (sliding_window={window}, max_position_embeddings="
                                    f"{limit}) is not supported: the exact codec attends to the whole context")


@contextlib.contextmanager
def ieee_matmul() -> Iterator[None]:
    """Full IEEE float32 GEMMs for the block: no TF32 on CUDA, no bf16 inner products on oneDNN, which
    ``torch.set_float32_matmul_precision("high"/"medium")`` allows (vLLM's GPU worker sets it in its
    own process). The per-backend switches are process-global, so they are set to ``ieee`` for the
    pass and restored after, never assumed; a concurrent float user only gets more precision meanwhile."""
    backends = (torch.backends.cuda.matmul, torch.backends.mkldnn.matmul)
    saved = [b.fp32_precision for b in backends]
    try:
        for b in backends:
            if b.fp32_precision != "ieee":
                b.fp32_precision = "ieee"
        yield
    finally:
        for b, value in zip(backends, saved, strict=True):
            if b.fp32_precision != value:
                b.fp32_precision = value


def _exact_pass(method: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(method)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with ieee_matmul():
            return method(*args, **kwargs)
    return run


@functools.cache
def _scalar(value: float, device: str) -> torch.Tensor:
    """A float64 0-dim tensor on ``device``: dividing by it is a true IEEE division on every device
    (CUDA turns ``tensor / python_scalar`` into a multiplication by the reciprocal)."""
    return torch.tensor(value, dtype=torch.float64, device=device)


class QuantLinear:
    """``y ≈ x Wᵀ (+ b)`` with int8 weights per output channel and per-token activation integers.

    The weights are stored as int8 ``(in, out)``. With ``int8_gemm`` (and a probe that passed for this
    shape) the product is ``torch._int_mm``; otherwise each GEMM converts one piece of ≤ 1,040 input
    rows to float32 on the fly (int8 values are exact in float32), so the stored model stays at one
    byte per weight either way. On the float32 path the output layer's int16 activations are split as
    ``hi·2**8 + lo`` with ``|hi|, |lo| ≤ 128``, two float32 products per piece of ≤ 1,032 terms
    (128·127·1032 < 2**24), recombined exactly in float64: the same integer sum as a float64 GEMM, at
    float32 speed (the int8 path's digits: ``_int8_product``)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, act_max: float,
                 device: torch.device, int8_gemm: bool = False, unit: float = 1.0) -> None:
        w = weight.to(device="cpu", dtype=torch.float64)
        amax = w.abs().amax(dim=1)
        amax = torch.where(amax > 0, amax, torch.ones_like(amax))
        self.out_features, self.in_features = w.shape
        self.act_max = act_max
        # ``unit`` (a power of two) scales the output exactly: (step·scale)·2**n rounds as step·(scale·2**n).
        self.scale = (amax / _scalar(_ACT8, "cpu") * unit).to(device)
        q = rint(w * _ACT8 / amax[:, None])
        if act_max == _ACT8:
            product = _ACT8 * _ACT8
        elif act_max == _ACT16:
            product = (_ACT8 + 1) * _ACT8
            if act_max * _ACT8 * self.in_features >= _FP64_EXACT:
                raise UnsupportedModelError(f"a {self.in_features}-term reduction is too long for exact float64 sums")
        else:
            raise ValueError(f"activations of ±{act_max} are not supported")
        step = int((_FP32_EXACT - 1) // product)
        self.pieces = [(i, min(i + step, self.in_features)) for i in range(0, self.in_features, step)]
        self.weight = q.t().contiguous().to(torch.int8).to(device)
        self.device = device
        self._act = _scalar(act_max, str(device))
        self._one = _scalar(1.0, str(device))
        self.bias = None if bias is None else bias.to(device=device, dtype=torch.float64)
        self.int8_gemm = int8_gemm and int8_gemm_is_exact(self.device, self.in_features, self.out_features)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        amax = x.abs().amax(dim=1, keepdim=True)
        step = torch.where(amax > 0, amax, self._one) / self._act
        m = rint_(x / step)  # |x / step| ≤ act_max
        acc = self._int8_product(m) if self.int8_gemm else self._float32_product(m)
        y = acc * (step * self.scale[None, :])
        return y if self.bias is None else y + self.bias

    def product(self, m: torch.Tensor) -> torch.Tensor:
        """``m @ W`` of ±127 activation integers (int8, from ``fused``) as exact integers: int32 from the
        int8 GEMM, float64 from the float32 pieces (the fused kernels take either)."""
        if self.int8_gemm:
            return int8_matmul(m, self.weight)
        return self._float32_product(m)

    def _int8_product(self, m: torch.Tensor) -> torch.Tensor:
        """``m @ W`` as exact integers in float64 through the host's int8 GEMM (``int8_gemm``):
        int16 activations as three int8 digits ``a·2**14 + b·2**7 + c`` (|b|, |c| ≤ 64, |a| ≤ 2),
        recombined in float64 (every term < 2**53, so exactly)."""
        if self.act_max == _ACT8:
            return int8_matmul(m.to(torch.int8), self.weight).to(torch.float64)
        rows = m.shape[0]
        t = rint_(m * 2.0**-7)
        a = rint_(t * 2.0**-7)
        r = int8_matmul(torch.cat([a, t - a * 128.0, m - t * 128.0]).to(torch.int8), self.weight)
        acc = r[:rows].to(torch.float64)
        return acc.mul_(128.0).add_(r[rows:2 * rows]).mul_(128.0).add_(r[2 * rows:])

    def _float32_product(self, m: torch.Tensor) -> torch.Tensor:
        """``m @ W`` as exact integers in float64 through float32 GEMMs of ≤ 1,040-term pieces."""
        rows = m.shape[0]
        if self.act_max == _ACT16:
            hi = rint_(m * 2.0**-8)
            m = torch.cat([hi, m - hi * 256.0])
        m32 = m.to(torch.float32)
        acc: torch.Tensor | None = None
        for a, b in self.pieces:
            part = (m32[:, a:b] @ self.weight[a:b].to(torch.float32)).to(torch.float64)
            if self.act_max == _ACT16:
                part = part[:rows] * 256.0 + part[rows:]
            acc = part if acc is None else acc + part
        assert acc is not None
        return acc

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.weight, self.scale, self.bias) if t is not None)


def exact_root(squares: torch.Tensor) -> torch.Tensor:
    """RMSNorm's per-row roots (``root.root``: ``exact-llama-1``'s machine root, or the correctly
    rounded one while the drift known answer traces; docs/architecture.md, "The square root")."""
    return root.root(squares)


def rms_norm(x: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm whose mean square is an exact sum (of the row scaled to int16 integers)."""
    device = str(x.device)
    amax = x.abs().amax(dim=1, keepdim=True)
    amax = torch.where(amax > 0, amax, _scalar(1.0, device))
    step = amax / _scalar(_ACT16, device)
    xi = rint(x / step)
    mean_square = (xi * xi).sum(dim=1, keepdim=True) / _scalar(float(x.shape[1]), device) * (step * step)
    return x / exact_root(mean_square + eps) * gain


def silu(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``x · sigmoid(x)`` with sigmoid read from the exact table at the nearest grid point."""
    half = tables.SIG_RANGE << tables.SIG_GRID_BITS
    index = rint(x * float(1 << tables.SIG_GRID_BITS)).clamp_(-half, half).to(torch.int64) + half
    return x * table[index]


def bytes_per_row_position(config: ExactConfig, dtype: torch.dtype = torch.int32) -> int:
    """KV-cache bytes one row needs per position (keys and values of every layer), for admission."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * itemsize


@dataclass
class KVCache:
    """Per layer: keys and values as fixed-point integers, ``(rows, kv_heads, capacity, head_dim)``.

    Integers in int32 (every clamp bound of the model fits; ``ExactLlama.cache_dtype`` says which
    dtype a model needs — int64 only for contexts under 64 positions). Row ``r`` holds
    ``lengths[r]`` valid positions; everything past them is ignored (masked) by attention."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    lengths: torch.Tensor

    @classmethod
    def allocate(cls, rows: int, length: int, layers: int, kv_heads: int, head_dim: int,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.int32) -> KVCache:
        shape = (rows, kv_heads, length, head_dim)
        return cls([torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)],
                   [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)],
                   torch.zeros(rows, dtype=torch.int64, device=device))

    bytes_per_row_position = staticmethod(bytes_per_row_position)

    @property
    def rows(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def capacity(self) -> int:
        return int(self.keys[0].shape[2]) if self.keys else 0

    @property
    def device(self) -> torch.device:
        return self.lengths.device

    @property
    def dtype(self) -> torch.dtype:
        return self.keys[0].dtype if self.keys else torch.int32

    def nbytes(self) -> int:
        """Bytes held by the cache's tensors."""
        return sum(t.numel() * t.element_size() for t in [*self.keys, *self.values, self.lengths])

    def keep(self, rows: torch.Tensor) -> None:
        """Drop every row not in ``rows`` (finished sequences), so steps touch only live ones."""
        rows = rows.to(self.device)
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]
        self.lengths = self.lengths[rows]

    def append(self, other: KVCache) -> None:
        """Add ``other``'s rows after this cache's rows (a segment joining a running cohort); the
        capacity becomes the larger of the two, the shorter side padded with unused positions."""
        if len(other.keys) != len(self.keys) or other.dtype != self.dtype or other.device != self.device:
            raise ValueError("caches of different layers, dtype or device cannot be joined")
        if self.keys and other.keys[0].shape[1::2] != self.keys[0].shape[1::2]:
            raise ValueError("caches of different head shapes cannot be joined")
        capacity = max(self.capacity, other.capacity)

        def pad(t: torch.Tensor) -> torch.Tensor:
            extra = capacity - t.shape[2]
            if not extra:
                return t
            return torch.cat([t, t.new_zeros((t.shape[0], t.shape[1], extra, t.shape[3]))], dim=2)

        self.keys = [torch.cat([pad(a), pad(b)]) for a, b in zip(self.keys, other.keys, strict=True)]
        self.values = [torch.cat([pad(a), pad(b)]) for a, b in zip(self.values, other.values, strict=True)]
        self.lengths = torch.cat([self.lengths, other.lengths])

    def copy_prefix(self, src_row: int, dst_rows: torch.Tensor, length: int) -> None:
        """Copy row ``src_row``'s first ``length`` positions into every row of ``dst_rows`` and set
        their lengths to ``length``: a segment's shared context, computed once, for each lane."""
        if not 0 <= length <= int(self.lengths[src_row]):
            raise ValueError(f"row {src_row} holds {int(self.lengths[src_row])} positions, not {length}")
        dst = dst_rows.to(device=self.device, dtype=torch.int64)
        for tensors in (self.keys, self.values):
            for t in tensors:
                t[dst, :, :length] = t[src_row, :, :length]
        self.lengths[dst] = length


class ExactLlama:
    """The exact forward pass: ``prefill`` (whole sequences) and ``step`` (one token per cached row).

    ``device``: where every tensor of the decision path lives (``cpu`` or ``cuda``); every operation
    but the square root is the same on each (the op audit, ``exact.audit``, lists them and why), and
    the drift known answer refuses a device whose square root differs from the CPU's.
    ``kernels``: ``fast`` uses the host's int8 GEMM for every linear layer whose shape it sums
    exactly (``exact.int8_gemm``, probed at load) and reads the int32 KV cache directly in decode
    steps (``exact.cache_products``, CPU) and runs the elementwise chains as compiled loops
    (``exact.fused``, CPU); ``reference`` runs float32 GEMMs and float64 ``bmm`` on a
    converted cache (the first release's kernels). Both give the same integers (tested)."""

    def __init__(self, config: ExactConfig, weights: dict[str, torch.Tensor], max_positions: int,
                 device: torch.device | str = "cpu", kernels: str = "fast") -> None:
        if kernels not in KERNELS:
            raise ValueError(f"kernels must be one of {KERNELS}, not {kernels!r}")
        int8_gemm = kernels == "fast"
        self.kernels = kernels
        self.config = config
        self.max_positions = max_positions
        self.device = torch.device(device)
        self.trace: Callable[[str, torch.Tensor], None] | None = None
        c = config
        dev = self.device
        used: set[str] = set()

        def take(name: str) -> torch.Tensor:
            used.add(name)
            return weights[name]

        def vector(name: str) -> torch.Tensor:
            return take(name).to(device=dev, dtype=torch.float64)

        embed = take("model.embed_tokens.weight")
        self.embed = embed.to(dev)  # the checkpoint's own dtype; rows become float64 exactly on lookup
        self.layers: list[dict[str, Any]] = []
        for i in range(c.num_layers):
            p = f"model.layers.{i}."

            def linear(names: tuple[str, ...], bias: bool, prefix: str = p) -> QuantLinear:
                """One GEMM for projections of the same input (q/k/v, gate/up): every output channel is
                quantised and summed on its own, so stacking them changes no bit and saves passes."""
                weight = torch.cat([take(prefix + name + ".weight") for name in names])
                biases = torch.cat([take(prefix + name + ".bias") for name in names]) if bias else None
                return QuantLinear(weight, biases, _ACT8, dev, int8_gemm)

            self.layers.append({
                "attn_norm": vector(p + "input_layernorm.weight"),
                "mlp_norm": vector(p + "post_attention_layernorm.weight"),
                "qkv": linear(("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), c.qkv_bias),
                "o": linear(("self_attn.o_proj",), c.o_bias),
                "gate_up": linear(("mlp.gate_proj", "mlp.up_proj"), c.mlp_bias),
                "down": linear(("mlp.down_proj",), c.mlp_bias)})
        self.final_norm = vector("model.norm.weight")
        head = embed if c.tie_word_embeddings else take("lm_head.weight")
        self.lm_head = QuantLinear(head, None, _ACT16, dev, int8_gemm, unit=float(1 << LOGIT_FRACTION_BITS))
        unused = sorted(k for k in weights if k not in used and not k.endswith("rotary_emb.inv_freq")
                        and not (c.tie_word_embeddings and k == "lm_head.weight"))
        if unused:
            raise UnsupportedModelError(f"the checkpoint holds weights the exact codec would ignore: {unused[:4]}")
        cos, sin = tables.rope_tables(c.head_dim, c.rope_theta, max_positions, c.rope_scaling)
        self.cos = torch.from_numpy(cos).to(dev)
        self.sin = torch.from_numpy(sin).to(dev)
        self.att_exp = torch.from_numpy(tables.attention_exp_table()).to(dev)
        self.sigmoid = torch.from_numpy(tables.sigmoid_table()).to(dev)
        # |p| ≤ 2**16 times |v| over max_positions terms must stay below 2**53.
        self.v_limit = float(min(1 << 40, (_FP64_EXACT - 1) // ((1 << tables.ATT_ONE_BITS) * max_positions)))
        self.qk_limit = float(min(1 << 40, math.isqrt((_FP64_EXACT - 1) // c.head_dim)))
        self.cache_dtype = torch.int32 if max(self.v_limit, self.qk_limit) < 2**31 else torch.int64
        self.score_to_grid = float(1 << tables.ATT_GRID_BITS) / (float(1 << (2 * _QK_BITS)) * math.sqrt(c.head_dim))
        self._v_unit = _scalar(float(1 << _V_BITS), str(dev))
        self._cache_kernels = kernels == "fast" and cache_products.usable(self.device, self.cache_dtype)
        self._fused = self._cache_kernels and fused.usable(
            self.device, float_products=not all(q.int8_gemm for q in self._linears()[1:]))

    @classmethod
    def from_pretrained(cls, path: str | Path, max_positions: int, device: torch.device | str = "cpu",
                        kernels: str = "fast") -> ExactLlama:
        from safetensors.torch import load_file

        root = Path(path)
        config = ExactConfig.from_hf(json.loads((root / "config.json").read_text()))
        weights: dict[str, torch.Tensor] = {}
        files = sorted(root.glob("*.safetensors"))
        if not files:
            raise UnsupportedModelError(f"no .safetensors weights in {root}")
        for file in files:
            weights.update(load_file(str(file)))
        return cls(config, weights, max_positions, device, kernels)

    def allocate_cache(self, rows: int, length: int) -> KVCache:
        """A KV cache for this model: its device and the integer dtype its clamp bounds need."""
        c = self.config
        return KVCache.allocate(rows, length, c.num_layers, c.num_kv_heads, c.head_dim, self.device, self.cache_dtype)

    def _linears(self) -> list[QuantLinear]:
        return [self.lm_head, *(x for layer in self.layers for x in layer.values() if isinstance(x, QuantLinear))]

    def kernel_summary(self) -> str:
        """Which kernels run (for the start-up log): the int8 GEMM's share of linear layers and
        whether decode attention reads the integer cache directly."""
        linears = self._linears()
        fast = sum(q.int8_gemm for q in linears)
        return (f"kernels={self.kernels}: int8 GEMM on {fast}/{len(linears)} linear layers, "
                f"integer-cache attention {'on' if self._cache_kernels else 'off'}, "
                f"fused elementwise kernels {'on' if self._fused else 'off'} ({self.device})")

    def nbytes(self) -> int:
        """Bytes of the model's tensors (weights, scales, tables) — the memory the codec role adds."""
        linears = self._linears()
        vectors = [self.embed, self.final_norm, self.cos, self.sin, self.att_exp, self.sigmoid,
                   *(x for layer in self.layers for x in layer.values() if isinstance(x, torch.Tensor))]
        return sum(q.nbytes() for q in linears) + sum(t.numel() * t.element_size() for t in vectors)

    # -- pieces -----------------------------------------------------------------------------------
    def _check_cache(self, cache: KVCache) -> None:
        if cache.device.type != self.device.type or self.device.index not in (None, cache.device.index):
            raise ValueError(f"the KV cache is on {cache.device}, the model on {self.device}")
        if cache.dtype == torch.int32 and self.cache_dtype != torch.int32:
            raise ValueError("this model's clamp bounds need an int64 KV cache (allocate_cache)")

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
        """q (…, Lq, D), k/v (…, Lk, D) fixed-point integers in float64; ``invalid`` (broadcastable to
        the scores' last ``invalid.shape[-1]`` keys) marks keys a query must not see. Returns (…, Lq, D).

        Masked scores become −2**60 (below any real score, |score| < 2**53), so their index saturates
        at the table's last entry, 0."""
        p = self._weights(q @ k.transpose(-1, -2), invalid)
        return (p @ v) / (p.sum(dim=-1, keepdim=True) * self._v_unit)

    def _weights(self, scores: torch.Tensor, invalid: torch.Tensor | None) -> torch.Tensor:
        """Integer attention weights (≤ 2**16) from exact integer scores, through the exp table
        (``scores`` is overwritten)."""
        if invalid is not None:
            scores[..., -invalid.shape[-1]:].masked_fill_(invalid, _MASKED)
        top = scores.amax(dim=-1, keepdim=True)
        last = float(self.att_exp.shape[0] - 1)
        index = rint_(torch.sub(top, scores, out=scores).mul_(self.score_to_grid).clamp_(max=last))
        return self.att_exp[index.to(torch.int64)]

    def _attend_cached(self, q: torch.Tensor, cache: KVCache, layer: int, span: int, invalid: torch.Tensor,
                       cache_rows: torch.Tensor | None = None) -> torch.Tensor:
        """Decode-step attention of q (queries, kv_heads, group, D) over the first ``span`` cached
        positions of each query's cache row (``cache_rows``; default: query ``r`` reads row ``r``). With
        the cache kernels (``cache_products``) the int32 cache is read directly; otherwise a few queries
        at a time: each chunk's integer keys and values become float64 in a buffer of at most
        ``_KV_BLOCK_ELEMENTS`` (cache-resident) instead of one copy of the whole context — the same
        values, so the same bits, at a fraction of the memory traffic."""
        rows = q.shape[0]
        keys, values = cache.keys[layer], cache.values[layer]
        if self._cache_kernels:
            p = self._weights(cache_products.scores(q, keys, span, cache_rows), invalid)
            return (cache_products.weighted(p, values, span, cache_rows)
                    / (p.sum(dim=-1, keepdim=True) * self._v_unit))
        if cache_rows is not None:
            keys, values = keys[cache_rows], values[cache_rows]
        chunk = max(1, _KV_BLOCK_ELEMENTS // (keys.shape[1] * span * keys.shape[3]))
        if chunk >= rows:
            return self._attend(q, keys[:, :, :span].to(torch.float64), values[:, :, :span].to(torch.float64), invalid)
        out = torch.empty_like(q)
        for a in range(0, rows, chunk):
            b = min(rows, a + chunk)
            out[a:b] = self._attend(q[a:b], keys[a:b, :, :span].to(torch.float64),
                                    values[a:b, :, :span].to(torch.float64), invalid[a:b])
        return out

    def _causal(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal self-attention of one sequence: q (kv_heads, group, L, D), k/v (kv_heads, L, D).

        Queries go in blocks that see only their prefix; a block's queries of every head of a group
        are one matrix ``(kv_heads, group·block, D)`` against the shared keys, so grouped-query
        attention copies no keys, and a block holds at most ``_SCORE_ELEMENTS`` scores."""
        heads, group, n, dim = q.shape
        out = torch.empty_like(q)
        block = max(1, min(_QUERY_BLOCK, _SCORE_ELEMENTS // max(1, q.shape[0] * group * n)))
        for a in range(0, n, block):
            b = min(n, a + block)
            invalid = torch.ones(b - a, b - a, dtype=torch.bool, device=q.device).triu_(1)
            qb = q[:, :, a:b].reshape(heads, group * (b - a), dim)
            mask = invalid.repeat(group, 1)
            out[:, :, a:b] = self._attend(qb, k[:, :b], v[:, :b], mask).view(heads, group, b - a, dim)
        return out

    def _mlp(self, layer: dict[str, Any], x: torch.Tensor) -> torch.Tensor:
        h = rms_norm(x, layer["mlp_norm"], self.config.rms_norm_eps)
        gate_up = layer["gate_up"](h)
        inter = self.config.intermediate_size
        return layer["down"](silu(gate_up[:, :inter], self.sigmoid) * gate_up[:, inter:])

    def _qkv(self, layer: dict[str, Any], x: torch.Tensor, positions: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c = self.config
        h = rms_norm(x, layer["attn_norm"], c.rms_norm_eps)
        n = x.shape[0]
        qkv = layer["qkv"](h)
        q_end = c.num_heads * c.head_dim
        k_end = q_end + c.num_kv_heads * c.head_dim
        q = self._rope(qkv[:, :q_end].reshape(n, c.num_heads, c.head_dim), positions)
        k = self._rope(qkv[:, q_end:k_end].reshape(n, c.num_kv_heads, c.head_dim), positions)
        v = self._values(qkv[:, k_end:].reshape(n, c.num_kv_heads, c.head_dim))
        return q, k, v

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed[tokens].to(torch.float64)

    def _traced(self, name: str, x: torch.Tensor) -> None:
        if self.trace is not None:
            self.trace(name, x)

    # -- passes -----------------------------------------------------------------------------------
    @_exact_pass
    def prefill(self, sequences: list[list[int]], cache: KVCache | None = None,
                rows: list[int] | None = None) -> torch.Tensor:
        """Final hidden states of every position of every sequence, packed ``(Σ len, hidden)``.

        With ``cache``, sequence ``i`` is written to cache row ``rows[i]`` (its positions 0…len-1).
        """
        dev = self.device
        lengths = [len(s) for s in sequences]
        if min(lengths) < 1 or max(lengths) > self.max_positions:
            raise ValueError(f"sequences must hold 1…{self.max_positions} tokens")
        if cache is not None:
            self._check_cache(cache)
        tokens = torch.tensor([t for s in sequences for t in s], dtype=torch.int64, device=dev)
        positions = torch.cat([torch.arange(n, device=dev) for n in lengths])
        x = self._embed(tokens)
        if self._fused:
            x = self._fused_layers(x, positions, lambda li, q, k, v: fused.quantize(
                self._prefill_attention(li, q, k, v, lengths, cache, rows).view(q.shape[0], -1)))
        else:
            for li, layer in enumerate(self.layers):
                q, k, v = self._qkv(layer, x, positions)
                out = self._prefill_attention(li, q, k, v, lengths, cache, rows)
                x = x + layer["o"](out.reshape(x.shape[0], -1))
                x = x + self._mlp(layer, x)
                self._traced(f"layer{li}", x)
        if cache is not None and rows is not None:
            cache.lengths[torch.tensor(rows, device=dev)] = torch.tensor(lengths, device=dev)
        return x

    def _prefill_attention(self, li: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int],
                           cache: KVCache | None, rows: list[int] | None) -> torch.Tensor:
        """Causal attention of each packed sequence (its keys and values into its cache row, if any)."""
        c = self.config
        group = c.num_heads // c.num_kv_heads
        out = torch.empty(q.shape[0], c.num_heads, c.head_dim, dtype=torch.float64, device=self.device)
        start = 0
        for si, n in enumerate(lengths):
            qs = q[start:start + n].transpose(0, 1).reshape(c.num_kv_heads, group, n, c.head_dim)
            ks, vs = (t[start:start + n].transpose(0, 1) for t in (k, v))
            out[start:start + n] = self._causal(qs, ks, vs).view(c.num_heads, n, c.head_dim).transpose(0, 1)
            if cache is not None and rows is not None:
                cache.keys[li][rows[si], :, :n] = ks
                cache.values[li][rows[si], :, :n] = vs
            start += n
        return out

    def _fused_layers(self, x: torch.Tensor, positions: torch.Tensor,
                      attention: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor],
                                          tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Every layer through the fused kernels (``fused``): the same operations as the torch path, a
        handful of compiled loops per layer instead of ~100 small ops. ``attention(layer, q, k, v)``
        returns the output projection's int8 input and its steps."""
        c = self.config
        eps = c.rms_norm_eps
        m, steps = fused.norm_quantize(x, self.layers[0]["attn_norm"], eps)
        for li, layer in enumerate(self.layers):
            qkv, o, gate_up, down = layer["qkv"], layer["o"], layer["gate_up"], layer["down"]
            q, k, v = fused.qkv(qkv.product(m), steps, qkv.scale, qkv.bias, positions, self.cos, self.sin,
                                c.num_heads, c.num_kv_heads, c.head_dim, self.qk_limit, self.v_limit)
            m, steps = attention(li, q, k, v)
            x, squares = fused.residual(x, o.product(m), steps, o.scale, o.bias, eps)
            m, steps = fused.norm_quantize(x, layer["mlp_norm"], eps, squares)
            m, steps = fused.silu_quantize(gate_up.product(m), steps, gate_up.scale, gate_up.bias, self.sigmoid)
            x, squares = fused.residual(x, down.product(m), steps, down.scale, down.bias, eps)
            if li + 1 < len(self.layers):
                m, steps = fused.norm_quantize(x, self.layers[li + 1]["attn_norm"], eps, squares)
            self._traced(f"layer{li}", x)
        return x

    @_exact_pass
    def step(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One token for every cache row at its next position (the rows' lengths advance by one);
        returns final hidden states."""
        positions = cache.lengths
        hidden = self.verify(tokens, cache, torch.arange(tokens.shape[0], device=self.device), positions)
        cache.lengths = positions + 1
        return hidden

    @_exact_pass
    def verify(self, tokens: torch.Tensor, cache: KVCache, cache_rows: torch.Tensor, positions: torch.Tensor
               ) -> torch.Tensor:
        """Token ``j`` at position ``positions[j]`` of cache row ``cache_rows[j]``; returns final hidden states.

        The multi-position pass of speculative decoding: a lane's fed token and its draft are queries of
        one row at consecutive positions. Every query's key and value are stored before any query
        attends, and query ``j`` sees its row's positions ``≤ positions[j]``, so each position gets
        exactly the hidden state a step-by-step decode (or a prefill) gives it: every row of the pass
        depends only on its own inputs and exact sums. Positions past a row's length must be consecutive
        from it; lengths are the caller's to set (only accepted positions count: later ones are
        overwritten before they are read again, and masked until then)."""
        self._check_cache(cache)
        c = self.config
        dev = self.device
        group = c.num_heads // c.num_kv_heads
        positions = positions.to(device=dev, dtype=torch.int64)
        cache_rows = cache_rows.to(device=dev, dtype=torch.int64)
        span = int(positions.max()) + 1
        if span > cache.capacity:
            raise ValueError("a row's cache is full")
        x = self._embed(tokens.to(dev))
        n = x.shape[0]
        if self._fused:
            def cached(li: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
                keys, values = cache.keys[li], cache.values[li]
                fused.store(k, v, cache_rows, positions, keys, values)
                scores = cache_products.scores(q.view(n, c.num_kv_heads, group, c.head_dim), keys, span, cache_rows)
                p, sums = fused.weights(scores, positions, self.score_to_grid, self.att_exp)
                return fused.normalise_quantize(cache_products.weighted(p, values, span, cache_rows), sums,
                                                float(1 << _V_BITS))

            x = self._fused_layers(x, positions, cached)
        else:
            invalid = (torch.arange(span, device=dev)[None, :] > positions[:, None])[:, None, None, :]
            for li, layer in enumerate(self.layers):
                q, k, v = self._qkv(layer, x, positions)
                cache.keys[li][cache_rows, :, positions] = k.to(cache.dtype)
                cache.values[li][cache_rows, :, positions] = v.to(cache.dtype)
                out = self._attend_cached(q.view(n, c.num_kv_heads, group, c.head_dim), cache, li, span, invalid,
                                          cache_rows)
                x = x + layer["o"](out.reshape(n, -1))
                x = x + self._mlp(layer, x)
                self._traced(f"layer{li}", x)
        return x

    @_exact_pass
    def logits_before_rounding(self, hidden: torch.Tensor) -> torch.Tensor:
        """The float64 logits in units of 2**-16 just before ``rint`` (what the drift check digests)."""
        return self.lm_head(rms_norm(hidden, self.final_norm, self.config.rms_norm_eps))

    @_exact_pass
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Integer logits in units of 2**-16 (int64), from final hidden states."""
        head = self.lm_head
        if self._fused and head.int8_gemm:
            digits, steps = fused.norm_digits(hidden, self.final_norm, self.config.rms_norm_eps)
            return fused.integer_logits(int8_matmul(digits, head.weight), steps, head.scale)
        return rint_(self.logits_before_rounding(hidden).clamp_(-_RINT_LIMIT, _RINT_LIMIT)).to(torch.int64)
