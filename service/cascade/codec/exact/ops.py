"""The exact model's torch operations: quantised linear layers, RMSNorm, SiLU — each exact by the bound
stated beside it (the whole argument: ``model``'s docstring; the op-by-op review: ``audit``).

Every function here runs on any device; ``kernels.TorchKernels`` composes them into a layer, and the
compiled kernels (``fused``) perform the same operations in the same order.
"""

from __future__ import annotations

import functools

import torch

from cascade.codec.exact import root, tables
from cascade.codec.exact.grid import ACT8, ACT16, FP32_EXACT, FP64_EXACT, rint, rint_
from cascade.codec.exact.int8_gemm import column_major, int8_gemm_is_exact, int8_gemm_is_faster, int8_matmul

F32_COLUMNS = 1024
"""Outputs per block of the float32 path (a block of 1,024 × 576 weights is 2.4 MB as float32)."""
F64_GEMM_ROWS = 64
"""Rows from which the output layer's product on the float path is one float64 GEMM (``_float32_product``)."""


class UnsupportedModelError(ValueError):
    """The checkpoint is not one the exact path can run (named in the message)."""


@functools.cache
def _scalar(value: float, device: str) -> torch.Tensor:
    """A float64 0-dim tensor on ``device``: dividing by it is a true IEEE division on every device
    (CUDA turns ``tensor / python_scalar`` into a multiplication by the reciprocal)."""
    return torch.tensor(value, dtype=torch.float64, device=device)


class QuantLinear:
    """``y ≈ x Wᵀ (+ b)`` with int8 weights per output channel and per-token activation integers.

    The weights are stored as int8 ``(in, out)``, column-major (a transposed view of the checkpoint's
    ``(out, in)`` layout): the host's int8 GEMM then reads each output's weights contiguously, which
    halves a one-row product's time on the CPU (measured: 120 SmolLM2 products 9.3 → 5.5 ms) and is
    never slower up to prefill-sized blocks. With ``int8_gemm`` (and probes that found the host's int8
    GEMM exact, and faster than the float32 pieces, for this shape) the product is ``torch._int_mm``;
    otherwise each GEMM converts one piece of ≤ 1,040 input rows to float32 on the fly (int8 values are
    exact in float32), so the stored model stays at one byte per weight either way; the output layer's
    ±32,767 activations take one float64 GEMM there from ``F64_GEMM_ROWS`` rows on, and two float32 digit
    rows below (the int8 path's digits: ``_int8_product``)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, act_max: float,
                 device: torch.device, int8_gemm: bool = False, unit: float = 1.0) -> None:
        w = weight.to(device="cpu", dtype=torch.float64)
        amax = w.abs().amax(dim=1)
        amax = torch.where(amax > 0, amax, torch.ones_like(amax))
        self.out_features, self.in_features = w.shape
        self.act_max = act_max
        # ``unit`` (a power of two) scales the output exactly: (step·scale)·2**n rounds as step·(scale·2**n).
        self.scale = (amax / _scalar(ACT8, "cpu") * unit).to(device)
        q = rint(w * ACT8 / amax[:, None])
        if act_max == ACT8:
            product = ACT8 * ACT8
        elif act_max == ACT16:
            product = (ACT8 + 1) * ACT8
            if act_max * ACT8 * self.in_features >= FP64_EXACT:
                raise UnsupportedModelError(f"a {self.in_features}-term reduction is too long for exact float64 sums")
        else:
            raise ValueError(f"activations of ±{act_max} are not supported")
        step = int((FP32_EXACT - 1) // product)
        self.pieces = [(i, min(i + step, self.in_features)) for i in range(0, self.in_features, step)]
        self.weight = column_major(q.t().to(torch.int8).to(device))
        self.rows = self.weight.t()
        """The same int8 weights as ``(out, in)`` rows, contiguous (``fused.int8_product``'s operand)."""
        self.device = device
        self.bias = None if bias is None else bias.to(device=device, dtype=torch.float64)
        # Speed first: where the int8 GEMM is slower (AVX2 hosts) its exactness probe, ~2 s there, is moot.
        self.int8_gemm = (int8_gemm and int8_gemm_is_faster(self.device, self.in_features, self.out_features)
                          and int8_gemm_is_exact(self.device, self.in_features, self.out_features))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        m, step = quantize(x, self.act_max)
        return self.output(self.exact_product(m), step)

    def output(self, acc: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        """The layer's output from the exact integer product ``acc`` of activations on grid ``step``."""
        y = acc * (step * self.scale[None, :])
        return y if self.bias is None else y + self.bias

    def exact_product(self, m: torch.Tensor) -> torch.Tensor:
        """``m @ W`` of activation integers (float64) as exact integers in float64."""
        return self._int8_product(m) if self.int8_gemm else self._float32_product(m)

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
        if self.act_max == ACT8:
            return int8_matmul(m.to(torch.int8), self.weight).to(torch.float64)
        t = rint_(m * 2.0**-7)
        a = rint_(t * 2.0**-7)
        return digit_product(torch.cat([a, t - a * 128.0, m - t * 128.0]).to(torch.int8), self.weight)

    def _float32_product(self, m: torch.Tensor) -> torch.Tensor:
        """``m @ W`` as exact integers in float64, over blocks of ≤ ``F32_COLUMNS`` outputs: a block's weights,
        converted, stay in cache for its GEMM (converting SmolLM2's whole output layer per call wrote 113 MB:
        3 rows of logits 76 → 11 ms on a Zen 3 host). ±127 activations: float32 GEMMs of ≤ 1,040-term pieces,
        each exact, the first written into the result and the others added to it in float64. ±32,767 ones
        (the output layer), from ``F64_GEMM_ROWS`` rows on: one float64 GEMM, exact because every partial sum
        is an integer below 2**53 (checked at load), at ~0.7–0.85× the time of the two float32 digit rows
        below (Zen 3, 2 threads: pycoder-23m's head at 1,024 rows 148 against 209 ms, SmolLM2's at 128 rows
        278 against 367 ms); fewer rows split ``m = hi·2**8 + lo`` (|hi|, |lo| ≤ 128) into two float32
        products per piece of ≤ 1,032 terms, recombined in float64, since converting the weights to float64
        costs more than the product there (SmolLM2's head at 33 rows: 115 against 92 ms)."""
        rows = m.shape[0]
        acc = torch.empty((rows, self.out_features), dtype=torch.float64, device=self.device)
        if self.act_max == ACT16 and rows >= F64_GEMM_ROWS:
            m64 = m.to(torch.float64)
            for c in range(0, self.out_features, F32_COLUMNS):
                torch.mm(m64, self.weight[:, c:c + F32_COLUMNS].to(torch.float64), out=acc[:, c:c + F32_COLUMNS])
            return acc
        if self.act_max == ACT16:
            hi = rint_(m * 2.0**-8)
            m = torch.cat([hi, m - hi * 256.0])
        m32 = m.to(torch.float32)
        for c in range(0, self.out_features, F32_COLUMNS):
            block, weight = acc[:, c:c + F32_COLUMNS], self.weight[:, c:c + F32_COLUMNS]
            for i, (a, b) in enumerate(self.pieces):
                part = (m32[:, a:b] @ weight[a:b].to(torch.float32)).to(torch.float64)
                if self.act_max == ACT16:
                    part = part[:rows].mul_(256.0).add_(part[rows:])
                if i == 0:
                    block.copy_(part)
                else:
                    block.add_(part)
        return acc

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.weight, self.scale, self.bias) if t is not None)


def digit_values(digits: torch.Tensor) -> torch.Tensor:
    """The ±32,767 integers (float64) of three int8 digit rows ``a·2**14 + b·2**7 + c`` stacked as
    ``(3·rows, K)`` (``fused.norm_digits``'s), for a GEMM that takes them whole."""
    rows = digits.shape[0] // 3
    d = digits.to(torch.float64)
    return d[:rows].mul(128.0).add_(d[rows:2 * rows]).mul_(128.0).add_(d[2 * rows:])


def digit_product(digits: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``m @ W`` as exact integers in float64, from ``m``'s three int8 digit rows ``a·2**14 + b·2**7 + c``
    stacked as ``(3·rows, K)``: one int8 GEMM (``int8_gemm``), recombined in float64 (every term < 2**53,
    so exactly)."""
    rows = digits.shape[0] // 3
    r = int8_matmul(digits, weight)
    acc = r[:rows].to(torch.float64)
    return acc.mul_(128.0).add_(r[rows:2 * rows]).mul_(128.0).add_(r[2 * rows:])


def exact_root(squares: torch.Tensor) -> torch.Tensor:
    """RMSNorm's per-row roots (``root.root``: the correctly rounded root, or this machine's inside
    ``root.machine()``; docs/architecture.md, "The square root")."""
    return root.root(squares)


def rms_norm(x: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm whose mean square is an exact sum (of the row scaled to int16 integers)."""
    device = str(x.device)
    amax = x.abs().amax(dim=1, keepdim=True)
    amax = torch.where(amax > 0, amax, _scalar(1.0, device))
    step = amax / _scalar(ACT16, device)
    xi = rint(x / step)
    mean_square = (xi * xi).sum(dim=1, keepdim=True) / _scalar(float(x.shape[1]), device) * (step * step)
    return x / exact_root(mean_square + eps) * gain


def quantize(x: torch.Tensor, act_max: float = ACT8) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row activation integers ``m = rint(x / step)`` (|m| ≤ ``act_max``) and their grid ``step``
    (the row's largest magnitude ÷ ``act_max``; 1 ÷ ``act_max`` for a zero row)."""
    device = str(x.device)
    amax = x.abs().amax(dim=1, keepdim=True)
    step = torch.where(amax > 0, amax, _scalar(1.0, device)) / _scalar(act_max, device)
    return rint_(x / step), step


def silu(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``x · sigmoid(x)`` with sigmoid read from the exact table at the nearest grid point."""
    half = tables.SIG_RANGE << tables.SIG_GRID_BITS
    index = rint(x * float(1 << tables.SIG_GRID_BITS)).clamp_(-half, half).to(torch.int64) + half
    return x * table[index]
