"""A Llama-family forward pass whose integer logits do not depend on batch, path, threads, ISA or device.

Why it is exact (the argument the codec's portability rests on):

- **Every reduction sums integers** whose partial sums provably stay below the float format's
  exact-integer limit, so any summation order — any BLAS kernel, blocking, thread count, SIMD
  width, batch shape or device — gives the same bits:

  * linear layers: int8 weights (per output channel, from the checkpoint) × int8 activations
    (per token) in float32 GEMMs, reductions split into pieces of at most 1,040 terms so every
    partial sum stays below 2**24 (127·127·1040 < 2**24); the pieces are added in float64;
  * the output layer: int8 weights × int16 activations in a float64 GEMM (32767·127·K < 2**53,
    checked at load), or, for a few rows, split as ``hi·2**8 + lo`` (both ≤ 128 in magnitude) into two
    float32 products per piece of ≤ 1,032 terms (128·127·1032 < 2**24) recombined in float64;
  * attention: queries, keys and values on fixed grids (2**-10) with clamped magnitudes, and
    table-driven integer attention weights (≤ 2**16), both products in float64 with bounds
    checked at load time for the longest context;
  * RMSNorm's sum of squares: of the row re-scaled to int16 integers.
- **Every other operation is elementwise**: a single IEEE-754 binary64 ``+ − × ÷`` (correctly
  rounded by the standard on every conforming CPU and GPU, never fused into an FMA), RMSNorm's
  square root (the correctly rounded one, not MKL's vector root, which differs between CPUs —
  ``root``, docs/architecture.md, "The square root"), ``round``/``floor``,
  ``max``/``abs``, or an integer-indexed table lookup.
- **No transcendental function runs**: exp (softmax), sigmoid (SiLU) and RoPE's cos/sin come from
  ``tables``, built with ``decimal``/integer arithmetic.

A token's row therefore depends only on its own inputs and on exact sums, so the same text gives
bit-identical logits in prefill and in decode steps, alone or among other rows, on any device.

Storage is integer-native: linear weights int8, the embedding in the checkpoint's dtype (its rows
become float64 exactly), the KV cache int32 (``cache``). Linear layers run on the host's int8 GEMM
where a load-time probe shows it sums exactly (``int8_gemm``), else as the float32 pieces above.

One layer loop (``ExactLlama._forward``) serves prefill, decode steps and speculative verify; its
steps run on one kernel set chosen at load (``kernels``): torch's operations (``ops``, any device)
or, on the CPU, compiled loops of the same operations in the same order that also read the int32
cache directly (``fused``). The grids and limits live in ``grid``. Every aten op
and compiled kernel the decision path runs is on the reviewed allow-list in ``audit``, with the
value bounds its reasons state (CI fails otherwise), and ``known_answer`` digests the pre-rounding
intermediates to catch arithmetic drift at start-up.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import torch

from cascade.codec.exact import tables
from cascade.codec.exact.cache import KVCache
from cascade.codec.exact.grid import ACT8, ACT16
from cascade.codec.exact.kernels import (
    Attention,
    Geometry,
    Kernels,
    Layer,
    Values,
    logits_before_rounding,
    select_kernels,
)
from cascade.codec.exact.ops import QuantLinear, UnsupportedModelError

P = ParamSpec("P")
R = TypeVar("R")
NUMERICS_VERSION = "exact-llama-1"
KERNELS = ("fast", "reference")
LOGIT_FRACTION_BITS = 16
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")


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


class ExactLlama:
    """The exact forward pass: ``prefill`` (whole sequences), ``step`` (one token per cached row) and
    ``verify`` (several positions of cached rows) — one layer loop (``_forward``) with other positions.

    ``device``: where every tensor of the decision path lives (``cpu`` or ``cuda``); every operation
    but the square root is the same on each (the op audit, ``exact.audit``, lists them and why), and
    the drift known answer refuses a device whose arithmetic differs from the CPU's.
    ``kernels``: ``fast`` uses the host's int8 GEMM for every linear layer whose shape it sums
    exactly (``exact.int8_gemm``, probed at load) and, on the CPU, the compiled kernel set
    (``kernels.CompiledKernels``: the elementwise chains as compiled loops, the int32 KV cache read
    directly); ``reference`` runs float32 GEMMs and torch's operations (``kernels.TorchKernels``, the
    first release's kernels). The set is chosen once, here; all give the same integers (tested)."""

    def __init__(self, config: ExactConfig, weights: dict[str, torch.Tensor], max_positions: int,
                 device: torch.device | str = "cpu", kernels: str = "fast") -> None:
        if kernels not in KERNELS:
            raise ValueError(f"kernels must be one of {KERNELS}, not {kernels!r}")
        int8_gemm = kernels == "fast"
        self.kernel_setting = kernels
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

        def linear(prefix: str, names: tuple[str, ...], bias: bool) -> QuantLinear:
            weight = torch.cat([take(prefix + name + ".weight") for name in names])
            biases = torch.cat([take(prefix + name + ".bias") for name in names]) if bias else None
            return QuantLinear(weight, biases, ACT8, dev, int8_gemm)

        embed = take("model.embed_tokens.weight")
        self.embed = embed.to(dev)  # the checkpoint's own dtype; rows become float64 exactly on lookup
        self.layers = [
            Layer(attn_norm=vector(f"model.layers.{i}.input_layernorm.weight"),
                  qkv=linear(f"model.layers.{i}.", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                             c.qkv_bias),
                  o=linear(f"model.layers.{i}.", ("self_attn.o_proj",), c.o_bias),
                  mlp_norm=vector(f"model.layers.{i}.post_attention_layernorm.weight"),
                  gate_up=linear(f"model.layers.{i}.", ("mlp.gate_proj", "mlp.up_proj"), c.mlp_bias),
                  down=linear(f"model.layers.{i}.", ("mlp.down_proj",), c.mlp_bias))
            for i in range(c.num_layers)]
        self.final_norm = vector("model.norm.weight")
        head = embed if c.tie_word_embeddings else take("lm_head.weight")
        self.lm_head = QuantLinear(head, None, ACT16, dev, int8_gemm, unit=float(1 << LOGIT_FRACTION_BITS))
        unused = sorted(k for k in weights if k not in used and not k.endswith("rotary_emb.inv_freq")
                        and not (c.tie_word_embeddings and k == "lm_head.weight"))
        if unused:
            raise UnsupportedModelError(f"the checkpoint holds weights the exact codec would ignore: {unused[:4]}")
        self.geometry = Geometry.build(c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
                                       c.rms_norm_eps, c.rope_theta, c.rope_scaling, max_positions, dev)
        self.cache_dtype = self.geometry.cache_dtype
        self.kernels: Kernels = select_kernels(kernels, dev, self.geometry,
                                               [q for layer in self.layers for q in layer.linears()])

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
        return [self.lm_head, *(q for layer in self.layers for q in layer.linears())]

    def kernel_summary(self) -> str:
        """Which kernels run (for the start-up log): the int8 GEMM's share of linear layers and the kernel set."""
        linears = self._linears()
        fast = sum(q.int8_gemm for q in linears)
        return (f"kernels={self.kernel_setting}: int8 GEMM on {fast}/{len(linears)} linear layers, "
                f"{self.kernels.name} kernel set ({self.device})")

    def nbytes(self) -> int:
        """Bytes of the model's tensors (weights, scales, tables) — the memory the codec role adds."""
        g = self.geometry
        vectors = [self.embed, self.final_norm, g.cos, g.sin, g.att_exp, g.sigmoid]
        return (self.lm_head.nbytes() + sum(layer.nbytes() for layer in self.layers)
                + sum(t.numel() * t.element_size() for t in vectors))

    def _check_cache(self, cache: KVCache) -> None:
        if cache.device.type != self.device.type or self.device.index not in (None, cache.device.index):
            raise ValueError(f"the KV cache is on {cache.device}, the model on {self.device}")
        if cache.dtype == torch.int32 and self.cache_dtype != torch.int32:
            raise ValueError("this model's clamp bounds need an int64 KV cache (allocate_cache)")

    # -- the forward pass ------------------------------------------------------------------------
    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, attention: Attention) -> torch.Tensor:
        """Every layer for ``tokens`` at ``positions``; ``attention`` says which keys each query sees (a
        packed prefill's own sequence, or its cache row). Returns the final hidden states."""
        k = self.kernels
        x: Values = self.embed[tokens].to(torch.float64)
        squares: Values | None = None
        for li, layer in enumerate(self.layers):
            x, squares = k.layer(li, layer, x, squares, positions, attention)
            if self.trace is not None:
                self.trace(f"layer{li}", k.to_tensor(x))
        return k.to_tensor(x)

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
        x = self._forward(tokens, positions, self.kernels.packed_attention(lengths, cache, rows))
        if cache is not None and rows is not None:
            cache.lengths[torch.tensor(rows, device=dev)] = torch.tensor(lengths, device=dev)
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
    def verify(self, tokens: torch.Tensor, cache: KVCache, cache_rows: torch.Tensor, positions: torch.Tensor,
               span: int | None = None) -> torch.Tensor:
        """Token ``j`` at position ``positions[j]`` of cache row ``cache_rows[j]``; returns final hidden states.

        The multi-position pass of speculative decoding: a lane's fed token and its draft are queries of
        one row at consecutive positions. Every query's key and value are stored before any query
        attends, and query ``j`` sees its row's positions ``≤ positions[j]``, so each position gets
        exactly the hidden state a step-by-step decode (or a prefill) gives it: every row of the pass
        depends only on its own inputs and exact sums. Positions past a row's length must be consecutive
        from it; lengths are the caller's to set (only accepted positions count: later ones are
        overwritten before they are read again, and masked until then). ``span``: the positions attention
        reads (default: up to the furthest query; ``graphs`` passes the capacity, a shape known in advance
        — the extra keys are masked, so the integers are the same)."""
        self._check_cache(cache)
        positions = positions.to(device=self.device, dtype=torch.int64)
        cache_rows = cache_rows.to(device=self.device, dtype=torch.int64)
        attention = self.kernels.cached_attention(cache, cache_rows, positions, span)
        return self._forward(tokens.to(self.device), positions, attention)

    @_exact_pass
    def logits_before_rounding(self, hidden: torch.Tensor) -> torch.Tensor:
        """The float64 logits in units of 2**-16 just before ``rint`` (what the drift check digests)."""
        return logits_before_rounding(hidden, self.final_norm, self.config.rms_norm_eps, self.lm_head)

    @_exact_pass
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Integer logits in units of 2**-16 (int64), from final hidden states."""
        return self.kernels.logits(hidden, self.final_norm, self.lm_head)
