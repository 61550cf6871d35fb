"""The kernel sets the exact model's one layer loop runs on: torch operations on any device, or the
compiled loops on the CPU. Chosen once, at load (``select_kernels``); both compute the same integers.

A layer (``Kernels.layer``, run by ``model.ExactLlama._forward``'s one loop) is seven steps, each a method here::

    a = norm_quantize(x, attn_norm)              RMSNorm, then the ±127 activation grid
    q, k, v = qkv(qkv_linear, a, positions)       the stacked q/k/v GEMM, RoPE, the 2**-10 grids
    a = attention(q, k, v)                        packed causal (prefill) or over the cache (decode, verify)
    x, s = residual(x, o_linear, a)               x + the output projection (s: the next RMSNorm's mean square)
    a = norm_quantize(x, mlp_norm, s)
    a = silu_quantize(gate_up_linear, a)          SiLU(gate)·up, then the ±127 grid
    x, s = residual(x, down_linear, a)

``Values`` pass between the steps: torch tensors in the torch set, numpy arrays in the compiled one
(``to_tensor`` gives a pass's result as a tensor). ``Activations`` are a linear layer's input: per-row
integers and their grid step (float64 integers and an ``(n, 1)`` step for the torch set, int8 and
``(n,)`` for the compiled one — each set reads only its own). ``TorchKernels`` is the definition:
every operation a reviewed aten op (``audit``), on the model's device (the GPU path).
``CompiledKernels`` (``fused``: numba, CPU) performs per element the very same IEEE operations in
the same order, and reads the int32 cache directly; a layer of a few cached rows (decode steps and
drafts' verify passes) runs its seven steps' compiled kernels in one launch (``fused.cached_layer``).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cascade.codec.exact import dispatch, fused, root, tables
from cascade.codec.exact.cache import KVCache
from cascade.codec.exact.grid import BYTE_TERMS, FP64_EXACT, MASKED, QK_BITS, QK_UNIT, RINT_LIMIT, V_UNIT, rint, rint_
from cascade.codec.exact.int8_gemm import INT32_TERMS, int8_matmul
from cascade.codec.exact.ops import QuantLinear, _scalar, digit_values, quantize, rms_norm, silu

Values = Any
"""What passes between a layer's steps: ``torch.Tensor`` in the torch set, ``numpy.ndarray`` in the compiled one."""
Activations = tuple[Values, Values]
Attention = Callable[[int, Values, Values, Values], Activations]
"""``attention(layer_index, q, k, v)``: one pass's attention (``packed_attention`` or ``cached_attention``)."""
_QUERY_BLOCK = 128
_SCORE_ELEMENTS = 1 << 22
_KV_BLOCK_ELEMENTS = 1 << 18


@dataclass(frozen=True)
class Layer:
    """One decoder layer as the exact pass holds it: RMSNorm gains (float64) and quantised linear layers
    (q/k/v and gate/up stacked: every output channel is quantised and summed on its own, so stacking
    changes no bit and saves passes)."""

    attn_norm: torch.Tensor
    qkv: QuantLinear
    o: QuantLinear
    mlp_norm: torch.Tensor
    gate_up: QuantLinear
    down: QuantLinear

    def linears(self) -> list[QuantLinear]:
        return [self.qkv, self.o, self.gate_up, self.down]

    def nbytes(self) -> int:
        return (sum(q.nbytes() for q in self.linears())
                + sum(t.numel() * t.element_size() for t in (self.attn_norm, self.mlp_norm)))


@dataclass(frozen=True)
class Geometry:
    """What the kernels need of a loaded model: its head layout and its exact tables and bounds."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    cos: torch.Tensor
    sin: torch.Tensor
    att_exp: torch.Tensor
    sigmoid: torch.Tensor
    qk_limit: float
    """|q|, |k| ≤ √(2**53 / head_dim): a q·k sum stays below 2**53."""
    v_limit: float
    """|v| ≤ 2**53 / (2**16 · positions): a p·v sum over the longest context stays below 2**53."""
    score_to_grid: float

    @classmethod
    def build(cls, num_heads: int, num_kv_heads: int, head_dim: int, intermediate_size: int, rms_norm_eps: float,
              rope_theta: float, rope_scaling: tables.RopeScaling, max_positions: int,
              device: torch.device) -> Geometry:
        cos, sin = tables.rope_tables(head_dim, rope_theta, max_positions, rope_scaling)
        return cls(num_heads, num_kv_heads, head_dim, intermediate_size, rms_norm_eps,
                   torch.from_numpy(cos).to(device), torch.from_numpy(sin).to(device),
                   torch.from_numpy(tables.attention_exp_table()).to(device),
                   torch.from_numpy(tables.sigmoid_table()).to(device),
                   qk_limit=float(min(1 << 40, math.isqrt((FP64_EXACT - 1) // head_dim))),
                   v_limit=float(min(1 << 40, (FP64_EXACT - 1) // ((1 << tables.ATT_ONE_BITS) * max_positions))),
                   score_to_grid=float(1 << tables.ATT_GRID_BITS) / (float(1 << (2 * QK_BITS)) * math.sqrt(head_dim)))

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def cache_dtype(self) -> torch.dtype:
        """int32 when every clamp bound fits it (all but contexts under 64 positions)."""
        return torch.int32 if max(self.v_limit, self.qk_limit) < 2**31 else torch.int64


class Kernels(ABC):
    """One kernel set: the layer's steps (module docstring) and the output layer's integer logits."""

    name: str

    def __init__(self, geometry: Geometry) -> None:
        self.g = geometry

    def to_tensor(self, x: Values) -> torch.Tensor:
        """A pass's result (the final hidden states) as a tensor."""
        return x

    def layer(self, li: int, layer: Layer, x: Values, squares: Values | None, positions: Values,
              attention: Attention) -> tuple[Values, Values | None]:
        """Decoder layer ``li`` of ``x`` at ``positions``: its seven steps (module docstring); returns its
        output and (compiled set) that output's ``mean_square + eps`` for the next RMSNorm."""
        q, keys, values = self.qkv(layer.qkv, self.norm_quantize(x, layer.attn_norm, squares), positions)
        x, squares = self.residual(x, layer.o, attention(li, q, keys, values))
        a = self.silu_quantize(layer.gate_up, self.norm_quantize(x, layer.mlp_norm, squares))
        return self.residual(x, layer.down, a)

    @abstractmethod
    def norm_quantize(self, x: Values, gain: torch.Tensor, squares: Values | None = None
                      ) -> Activations:
        """``quantize(rms_norm(x) · gain)``; ``squares``: the rows' ``mean_square + eps`` if ``residual`` gave them."""

    @abstractmethod
    def qkv(self, linear: QuantLinear, a: Activations, positions: Values) -> tuple[Values, Values, Values]:
        """Queries ``(n, heads, D)``, keys and values ``(n, kv_heads, D)``: integers on their grids."""

    @abstractmethod
    def residual(self, x: Values, linear: QuantLinear, a: Activations) -> tuple[Values, Values | None]:
        """``x + linear(a)``, and (compiled set) the sum's ``mean_square + eps`` for the next RMSNorm."""

    @abstractmethod
    def silu_quantize(self, linear: QuantLinear, a: Activations) -> Activations:
        """``quantize(silu(gate) · up)`` of the stacked gate/up layer."""

    @abstractmethod
    def attend_cached(self, q: Values, k: Values, v: Values, keys: torch.Tensor, values: torch.Tensor,
                      cache_rows: Values, positions: Values, span: int) -> Activations:
        """Query ``j`` stores its key and value at ``positions[j]`` of cache row ``cache_rows[j]``; then
        every query attends to its row's positions ``≤ positions[j]`` (of the first ``span``)."""

    def logits(self, hidden: torch.Tensor, gain: torch.Tensor, head: QuantLinear) -> torch.Tensor:
        """Integer logits in units of 2**-16 (int64)."""
        return rint_(logits_before_rounding(hidden, gain, self.g.rms_norm_eps, head)
                     .clamp_(-RINT_LIMIT, RINT_LIMIT)).to(torch.int64)

    # -- attention -------------------------------------------------------------------------------
    def packed_attention(self, lengths: list[int], cache: KVCache | None, rows: list[int] | None) -> Attention:
        """Prefill's attention: causal within each packed sequence (its keys and values written to cache
        row ``rows[i]`` as well, when there is a cache), in torch operations."""
        g = self.g

        def attend(li: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Activations:
            out = torch.empty(q.shape[0], g.num_heads, g.head_dim, dtype=torch.float64, device=q.device)
            start = 0
            for si, n in enumerate(lengths):
                qs = q[start:start + n].transpose(0, 1).reshape(g.num_kv_heads, g.group, n, g.head_dim)
                ks, vs = (t[start:start + n].transpose(0, 1) for t in (k, v))
                out[start:start + n] = self._causal(qs, ks, vs).view(g.num_heads, n, g.head_dim).transpose(0, 1)
                if cache is not None and rows is not None:
                    cache.keys[li][rows[si], :, :n] = ks
                    cache.values[li][rows[si], :, :n] = vs
                start += n
            return quantize(out.view(q.shape[0], -1))

        return attend

    def cached_attention(self, cache: KVCache, cache_rows: torch.Tensor, positions: torch.Tensor,
                         span: int | None = None) -> Attention:
        """Decode and verify attention over ``cache`` (``attend_cached``) up to position ``span``
        (default: the furthest query's; a larger one attends to more masked keys, the same integers)."""
        span = int(positions.max()) + 1 if span is None else span
        if span > cache.capacity:
            raise ValueError("a row's cache is full")
        return CachedAttention(self, cache, cache_rows, positions, span)

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

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, invalid: torch.Tensor | None
                ) -> torch.Tensor:
        """q (…, Lq, D), k/v (…, Lk, D) fixed-point integers in float64; ``invalid`` (broadcastable to
        the scores' last ``invalid.shape[-1]`` keys) marks keys a query must not see. Returns (…, Lq, D):
        ``p·v ÷ (Σp · 2**10)``, with integer weights ``p`` (``_weights``)."""
        p = self._weights(q @ k.transpose(-1, -2), invalid)
        return (p @ v) / (p.sum(dim=-1, keepdim=True) * _scalar(V_UNIT, str(q.device)))

    def _weights(self, scores: torch.Tensor, invalid: torch.Tensor | None) -> torch.Tensor:
        """Integer attention weights (≤ 2**16) from exact integer scores, through the exp table
        (``scores`` is overwritten). Masked scores become −2**60 (below any real score, |score| < 2**53),
        so their index saturates at the table's last entry, 0."""
        if invalid is not None:
            scores[..., -invalid.shape[-1]:].masked_fill_(invalid, MASKED)
        top = scores.amax(dim=-1, keepdim=True)
        last = float(self.g.att_exp.shape[0] - 1)
        index = rint_(torch.sub(top, scores, out=scores).mul_(self.g.score_to_grid).clamp_(max=last))
        return self.g.att_exp[index.to(torch.int64)]


@dataclass(frozen=True)
class CachedAttention:
    """Decode and verify attention (``Kernels.cached_attention``): query ``j`` is position ``positions[j]``
    of cache row ``cache_rows[j]``, and attends to that row's positions up to it (of the first ``span``)."""

    kernels: Kernels
    cache: KVCache
    cache_rows: Values
    positions: Values
    span: int

    def __call__(self, li: int, q: Values, k: Values, v: Values) -> Activations:
        return self.kernels.attend_cached(q, k, v, self.cache.keys[li], self.cache.values[li], self.cache_rows,
                                          self.positions, self.span)


def logits_before_rounding(hidden: torch.Tensor, gain: torch.Tensor, eps: float, head: QuantLinear
                           ) -> torch.Tensor:
    """The float64 logits in units of 2**-16 just before ``rint`` (what the drift check digests)."""
    return head(rms_norm(hidden, gain, eps))


class TorchKernels(Kernels):
    """Torch operations on the model's device: the definition of ``exact-llama-1``, and the GPU path."""

    name = "torch"

    def norm_quantize(self, x: torch.Tensor, gain: torch.Tensor, squares: torch.Tensor | None = None
                      ) -> Activations:
        return quantize(rms_norm(x, gain, self.g.rms_norm_eps))

    def qkv(self, linear: QuantLinear, a: Activations, positions: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        g = self.g
        qkv = linear.output(linear.exact_product(a[0]), a[1])
        n = qkv.shape[0]
        q_end = g.num_heads * g.head_dim
        k_end = q_end + g.num_kv_heads * g.head_dim
        q = self._rope(qkv[:, :q_end].reshape(n, g.num_heads, g.head_dim), positions)
        k = self._rope(qkv[:, q_end:k_end].reshape(n, g.num_kv_heads, g.head_dim), positions)
        v = rint(qkv[:, k_end:].reshape(n, g.num_kv_heads, g.head_dim) * V_UNIT).clamp_(-g.v_limit, g.v_limit)
        return q, k, v

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate-half RoPE of ``x`` (tokens, heads, head_dim), then onto the 2**-10 grid, clamped."""
        half = self.g.head_dim // 2
        cos = self.g.cos[positions][:, None, :]
        sin = self.g.sin[positions][:, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        a = x1 * cos
        b = x2 * sin
        c = x2 * cos
        d = x1 * sin
        rotated = torch.cat([a - b, c + d], dim=-1)
        return rint(rotated * QK_UNIT).clamp_(-self.g.qk_limit, self.g.qk_limit)

    def residual(self, x: torch.Tensor, linear: QuantLinear, a: Activations
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return x + linear.output(linear.exact_product(a[0]), a[1]), None

    def silu_quantize(self, linear: QuantLinear, a: Activations) -> Activations:
        gate_up = linear.output(linear.exact_product(a[0]), a[1])
        inter = self.g.intermediate_size
        return quantize(silu(gate_up[:, :inter], self.g.sigmoid) * gate_up[:, inter:])

    def attend_cached(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor,
                      values: torch.Tensor, cache_rows: torch.Tensor, positions: torch.Tensor, span: int
                      ) -> Activations:
        """A few queries at a time: each chunk's integer keys and values become float64 in a buffer of at
        most ``_KV_BLOCK_ELEMENTS`` (cache-resident) instead of one copy of the whole context — the same
        values, so the same bits, at a fraction of the memory traffic."""
        g = self.g
        n = q.shape[0]
        keys[cache_rows, :, positions] = k.to(keys.dtype)
        values[cache_rows, :, positions] = v.to(values.dtype)
        invalid = (torch.arange(span, device=q.device)[None, :] > positions[:, None])[:, None, None, :]
        q4 = q.view(n, g.num_kv_heads, g.group, g.head_dim)
        keys, values = keys[cache_rows], values[cache_rows]
        chunk = max(1, _KV_BLOCK_ELEMENTS // (keys.shape[1] * span * keys.shape[3]))
        out = torch.empty_like(q4)
        for a in range(0, n, chunk):
            b = min(n, a + chunk)
            out[a:b] = self._attend(q4[a:b], keys[a:b, :, :span].to(torch.float64),
                                    values[a:b, :, :span].to(torch.float64), invalid[a:b])
        return quantize(out.view(n, -1))


class CompiledKernels(Kernels):
    """The CPU's compiled loops (``fused``): the torch set's operations, in its order.

    Its values between steps are numpy arrays (``fused.Array``): a GEMM's int8 operand becomes a tensor
    view and its int32 result an array view, and the model's constants (gains, scales, biases, tables)
    are converted once. A one-row decode step launches ~200 kernels, and converting every operand and
    allocating every output through torch cost ~0.8 ms of a ~14 ms SmolLM2 pass (benchmarks/RESULTS.md,
    "Compiled kernels on numpy arrays")."""

    name = "compiled"

    def __init__(self, geometry: Geometry) -> None:
        super().__init__(geometry)
        self._arrays: dict[int, tuple[torch.Tensor, Any]] = {}
        self._layers: dict[int, tuple[Layer, tuple[Any, ...]]] = {}
        g = geometry
        self._tables = tuple(self._constant(t) for t in (g.cos, g.sin, g.att_exp, g.sigmoid))

    def _constant(self, t: torch.Tensor | None) -> Any:
        """A constant's array view, made once (the tensor is kept, so its id is not reused)."""
        if t is None:
            return None
        hit = self._arrays.get(id(t))
        if hit is None:
            hit = self._arrays[id(t)] = (t, fused.array(t))
        return hit[1]

    def _weight_rows(self, linear: QuantLinear) -> Any:
        """``linear``'s int8 weights as ``(out, in)`` rows: a view of their column-major storage."""
        return self._constant(linear.rows)

    @staticmethod
    def _streams(rows: int, linear: QuantLinear) -> bool:
        """Whether a product of ``rows`` int8 rows with ``linear`` runs as ``fused.int8_product``."""
        return rows <= fused.streamed_rows(linear.int8_gemm) and linear.in_features <= INT32_TERMS

    def _product(self, linear: QuantLinear, m: Any) -> Values:
        """``m @ W`` as exact integers: streamed (``fused.int8_product``) for a few rows, else the host's GEMM."""
        if self._streams(m.shape[0], linear):
            return fused.int8_product(m, self._weight_rows(linear))
        return linear.product(torch.from_numpy(m))

    def to_tensor(self, x: Values) -> torch.Tensor:
        return x if isinstance(x, torch.Tensor) else torch.from_numpy(x)

    def layer(self, li: int, layer: Layer, x: Values, squares: Values | None, positions: Values,
              attention: Attention) -> tuple[Values, Values | None]:
        """The seven steps in one compiled launch (``fused.cached_layer``) where they all run here on a few
        cached rows; else step by step. Step by step also under the op audit, which checks each kernel's
        operands, and with this machine's root (``root.machine``: not the compiled one)."""
        rows = x.shape[0]
        if (not isinstance(attention, CachedAttention) or dispatch.observers or root.machine_active()
                or not all(self._streams(rows, linear) for linear in layer.linears())):
            return super().layer(li, layer, x, squares, positions, attention)
        g = self.g
        x = fused.array(x)
        if squares is None:
            squares = fused.mean_squares(x, g.rms_norm_eps)
        cos, sin, att_exp, sigmoid = self._tables
        return fused.cached_layer(x, squares, attention.positions, attention.cache_rows, attention.cache.keys[li],
                                  attention.cache.values[li], self._layer_arrays(layer), cos, sin, att_exp, sigmoid,
                                  g.num_heads, g.qk_limit, g.v_limit, g.rms_norm_eps, g.score_to_grid, V_UNIT)

    def _layer_arrays(self, layer: Layer) -> tuple[Any, ...]:
        """``layer``'s constants in ``fused.cached_layer``'s order, made once."""
        hit = self._layers.get(id(layer))
        if hit is None:
            arrays: list[Any] = [self._constant(layer.attn_norm), *self._linear_arrays(layer.qkv),
                                 *self._linear_arrays(layer.o), self._constant(layer.mlp_norm),
                                 *self._linear_arrays(layer.gate_up), *self._linear_arrays(layer.down)]
            hit = self._layers[id(layer)] = (layer, tuple(arrays))
        return hit[1]

    def _linear_arrays(self, linear: QuantLinear) -> tuple[Any, Any, Any]:
        return self._weight_rows(linear), self._constant(linear.scale), fused.bias_array(self._constant(linear.bias))

    def norm_quantize(self, x: Values, gain: torch.Tensor, squares: Values | None = None) -> Activations:
        return fused.norm_quantize(x, self._constant(gain), self.g.rms_norm_eps, squares)

    def qkv(self, linear: QuantLinear, a: Activations, positions: Values) -> tuple[Values, Values, Values]:
        g = self.g
        return fused.qkv(self._product(linear, a[0]), a[1], self._constant(linear.scale), self._constant(linear.bias),
                         positions, self._constant(g.cos), self._constant(g.sin), g.num_heads, g.num_kv_heads,
                         g.head_dim, g.qk_limit, g.v_limit)

    def residual(self, x: Values, linear: QuantLinear, a: Activations) -> tuple[Values, Values | None]:
        return fused.residual(x, self._product(linear, a[0]), a[1], self._constant(linear.scale),
                              self._constant(linear.bias), self.g.rms_norm_eps)

    def silu_quantize(self, linear: QuantLinear, a: Activations) -> Activations:
        return fused.silu_quantize(self._product(linear, a[0]), a[1], self._constant(linear.scale),
                                   self._constant(linear.bias), self._constant(self.g.sigmoid))

    def attend_cached(self, q: Values, k: Values, v: Values, keys: torch.Tensor, values: torch.Tensor,
                      cache_rows: Values, positions: Values, span: int) -> Activations:
        """The int32 cache read directly, in one compiled launch (``fused.attend_cached``)."""
        g = self.g
        return fused.attend_cached(q, k, v, keys, values, cache_rows, positions, g.score_to_grid,
                                   self._constant(g.att_exp), V_UNIT)

    def cached_attention(self, cache: KVCache, cache_rows: torch.Tensor, positions: torch.Tensor,
                         span: int | None = None) -> Attention:
        """The base class's, with the pass's rows and positions as arrays once instead of once per layer."""
        return super().cached_attention(cache, fused.array(cache_rows), fused.array(positions), span)

    def packed_attention(self, lengths: list[int], cache: KVCache | None, rows: list[int] | None) -> Attention:
        """Prefill's attention is decode's compiled kernel (``fused.attend_cached``): position ``p`` of a
        packed sequence is a query at ``p`` of its cache row, which attends to that row's positions ``≤ p``,
        what the torch set's causal mask gives. Without a cache (compression needs only the logits) the rows
        are a scratch cache of the pass, shared by its layers (each layer writes every position before
        any query reads one). Same integers: the kernel's sums are the exact integer sums the torch set's
        GEMMs make, and its elementwise steps are the torch set's in its order (the kernel's docstring).
        Why: the torch set's score matrices and elementwise passes over them were the largest part of a
        compression chunk (pycoder-23m, 32 lanes of 256 tokens: encoding 3,900 → 4,900 tokens/s)."""
        g = self.g
        if cache is None or rows is None:
            shape = (len(lengths), g.num_kv_heads, max(lengths), g.head_dim)
            scratch = torch.zeros(shape, dtype=torch.int32), torch.zeros(shape, dtype=torch.int32)
            sequences = list(range(len(lengths)))

            def store(li: int) -> tuple[torch.Tensor, torch.Tensor]:
                return scratch
        else:
            kept = cache
            sequences = rows

            def store(li: int) -> tuple[torch.Tensor, torch.Tensor]:
                return kept.keys[li], kept.values[li]
        cache_rows = np.repeat(np.asarray(sequences, dtype=np.int64), lengths)
        positions = np.concatenate([np.arange(n, dtype=np.int64) for n in lengths])
        att_exp = self._constant(g.att_exp)

        def attend(li: int, q: Values, k: Values, v: Values) -> Activations:
            keys, values = store(li)
            return fused.attend_cached(q, k, v, keys, values, cache_rows, positions, g.score_to_grid, att_exp, V_UNIT)

        return attend

    def logits(self, hidden: torch.Tensor, gain: torch.Tensor, head: QuantLinear) -> torch.Tensor:
        """A few rows stream over the weights as two int8 digit rows each (``fused.byte_product``); more go
        through the host's int8 GEMM as three digit rows each, or the float32 pieces where that GEMM does
        not serve; the same integers either way. Up to two rows stream where the int8 GEMM would take
        more (a row's two digit rows are two streamed rows), up to ``fused.PIECES_STREAMED_ROWS`` where the
        float32 pieces would (SmolLM2's head on a Zen 3, streamed / pieces: 3 rows 6.0 / 34.6 ms, 32 rows
        56 / 70 ms). The totals are scaled and rounded in one compiled pass (``total_logits``; the int8
        GEMM's digit products are recombined in that pass too, ``digit_logits``): on the float path, 1,024
        rows of pycoder-23m's logits took 183–206 ms against 282 ms through torch's elementwise passes over
        the rows × vocabulary float64 totals."""
        streamed = self._streams(2 * hidden.shape[0] if head.int8_gemm else hidden.shape[0], head)
        if streamed and head.in_features <= BYTE_TERMS:
            digits, steps, fix_index, fix_value, fix_count = fused.norm_bytes(hidden, self._constant(gain),
                                                                              self.g.rms_norm_eps)
            totals = fused.byte_product(digits, fix_index, fix_value, fix_count, self._weight_rows(head))
            return torch.from_numpy(fused.total_logits(totals, steps, self._constant(head.scale)))
        digits, steps = fused.norm_digits(hidden, self._constant(gain), self.g.rms_norm_eps)
        if head.int8_gemm:
            products = int8_matmul(torch.from_numpy(digits), head.weight)
            return torch.from_numpy(fused.digit_logits(products, steps, self._constant(head.scale)))
        totals = head.exact_product(digit_values(torch.from_numpy(digits)))
        return torch.from_numpy(fused.total_logits(totals, steps, self._constant(head.scale)))


def select_kernels(setting: str, device: torch.device, geometry: Geometry, linears: list[QuantLinear]) -> Kernels:
    """The kernel set for ``setting`` (``fast``: the compiled loops wherever they run here — numba, the CPU,
    an int32 cache, machine code free of FMA, checked once; ``reference``: torch's operations)."""
    if (setting == "fast" and geometry.cache_dtype == torch.int32
            and fused.usable(device, float_products=not all(q.int8_gemm for q in linears))):
        return CompiledKernels(geometry)
    return TorchKernels(geometry)
