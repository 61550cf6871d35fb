"""The int8 GEMM path of the exact model: ``torch._int_mm`` where this host's kernel sums exactly.

An int8 × int8 product with int32 accumulation is an exact integer sum *if every multiply-add is*:
VNNI's ``vpdpbusd`` (CPUs since Cascade Lake / Zen 4) and integer tensor cores are. Without VNNI,
oneDNN's AVX2/SSE4.1 kernels add products in pairs into a saturating int16 (``vpmaddubsw``, with
the left operand shifted by +128 to unsigned): large operands come back wrong (measured: 163,838 of
163,840 entries under ``ONEDNN_MAX_CPU_ISA=AVX2``). Which kernel runs is the host's choice, not the
data's, so :func:`int8_gemm_is_exact` decides it once per host and shape with operands that make
every saturating kernel fail (±127 activations whose shifted bytes are 255, against ±127 weights)
and random ones, compared with the exact float64 product. A model uses the int8 path only for
shapes that passed; otherwise the float32 path (exact everywhere, slower). Both give the same
integers, so the choice never reaches a container; the start-up known answer checks the whole
model on the chosen path besides.

Operands stay within ±127 (the activations' own grid); the output layer's int16 activations are
split into three int8 digits (``a·2**14 + b·2**7 + c``, each ≤ 64 in magnitude) because two int8
digits cannot hold ±32,767. Every int32 result is below ``127 · 127 · K < 2**31`` for ``K`` under
133,000 inputs, checked at load.
"""

from __future__ import annotations

import functools
import logging
import time

import torch

logger = logging.getLogger("cascade.codec")
INT32_TERMS = ((1 << 31) - 1) // (127 * 127)
_LARGE_ROWS = 1024
_PROBE_ROWS = (1, 5, 33, 160, _LARGE_ROWS)
_CUDA_MIN_ROWS = 17
_SPEED_ROWS = 64
_SPEED_COLUMNS = 2048


def column_major(w: torch.Tensor) -> torch.Tensor:
    """``w (K, N)`` with each column contiguous: the layout ``ops.QuantLinear`` stores its weights in and the
    probe tests (a kernel is chosen by layout as well as by shape)."""
    return w.t().contiguous().t()


def int8_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a (M, K) int8 @ b (K, N) int8`` (``column_major``) → int32, padding rows where CUDA's kernel needs
    more than 16."""
    rows = a.shape[0]
    if a.device.type == "cuda" and rows < _CUDA_MIN_ROWS:
        a = torch.cat([a, a.new_zeros((_CUDA_MIN_ROWS - rows, a.shape[1]))])
        return torch._int_mm(a, b)[:rows]
    return torch._int_mm(a, b)


def _probe_operands(rows: int, k: int, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows alternating all +127, all −127 and random; columns all +127, all −127 and random signs of
    127 and random values: every pair of products a saturating kernel adds overflows int16 somewhere."""
    generator = torch.Generator().manual_seed(rows * 7919 + k * 31 + n)
    a = torch.randint(-127, 128, (rows, k), generator=generator, dtype=torch.int32)
    a[0::3] = 127
    a[1::3] = -127
    w = torch.randint(-127, 128, (k, n), generator=generator, dtype=torch.int32)
    w[:, 0::4] = 127
    w[:, 1::4] = -127
    w[:, 2::4] *= torch.randint(0, 2, (k, 1), generator=generator, dtype=torch.int32) * 2 - 1
    return a.to(torch.int8).to(device), column_major(w.to(torch.int8).to(device))


@functools.cache
def int8_gemm_is_exact(device: torch.device, k: int, n: int) -> bool:
    """Whether ``int8_matmul`` of ``(M, k) @ (k, n)`` returns the exact integer product on this host
    for every probed ``M`` (one row, a few, a decode cohort, a block and a prefill chunk): the same
    kernel family answers every call of that shape, and saturation shows on these operands whenever
    it can happen at all."""
    if k > INT32_TERMS:
        return False
    try:
        for rows in _PROBE_ROWS:
            # a prefill-sized block too (kernels choose their blocking by rows), on fewer columns
            a, w = _probe_operands(rows, k, n if rows < _LARGE_ROWS else min(n, 256), device)
            got = int8_matmul(a, w)
            expected = a.to(torch.float64) @ w.to(torch.float64)
            if got.dtype != torch.int32 or not torch.equal(got.to(torch.float64), expected):
                logger.info("int8 GEMM not exact on %s for (M=%d, K=%d): the float32 path is used", device, rows, k)
                return False
    except RuntimeError as exc:  # a shape or device the kernel does not take
        logger.info("int8 GEMM unavailable on %s for K=%d, N=%d (%s): the float32 path is used", device, k, n, exc)
        return False
    return True


@functools.cache
def int8_gemm_is_faster(device: torch.device, k: int, n: int) -> bool:
    """Whether the host's int8 GEMM of ``(M, k) @ (k, n)`` beats the float32 pieces that replace it
    (``ops.QuantLinear._float32_product``, which converts its weights on every call) on a block of
    decode-cohort size, timed here once (best of three each, interleaved).

    Why a timing and not the instruction set: an exact int8 kernel is not always a fast one. On an AVX2
    host without VNNI (measured on a Zen 3 EPYC) oneDNN's exact ``_int_mm`` ran 20–30× slower than the
    float32 GEMM (SmolLM2: a 512-token prefill 28 s against 1.7 s, its 512 rows of logits 21.5 s
    against 2.9 s), while on VNNI hosts it is the faster one. Both paths give the same integers, so
    the choice decides only speed, never a byte of a container; a timing disturbed by load can only
    pick the slower of two exact paths. CUDA keeps the int8 GEMM (integer tensor cores)."""
    if device.type != "cpu":
        return True
    generator = torch.Generator().manual_seed(k * 31 + n)
    a = torch.randint(-127, 128, (_SPEED_ROWS, k), generator=generator, dtype=torch.int8)
    w = column_major(torch.randint(-127, 128, (k, min(n, _SPEED_COLUMNS)), generator=generator, dtype=torch.int8))
    a32 = a.to(torch.float32)

    def int8() -> None:
        int8_matmul(a, w)

    def float32() -> None:
        a32 @ w.to(torch.float32)

    best = {int8: float("inf"), float32: float("inf")}
    try:
        for _ in range(3):
            for product in best:
                start = time.perf_counter()
                product()
                best[product] = min(best[product], time.perf_counter() - start)
    except RuntimeError as exc:  # a shape or device the kernel does not take
        logger.info("int8 GEMM unavailable on %s for K=%d, N=%d (%s): the float32 path is used", device, k, n, exc)
        return False
    faster = best[int8] <= best[float32]
    logger.info("int8 GEMM %s than float32 on %s for K=%d, N=%d (%.2f against %.2f ms): the %s path is used",
                "faster" if faster else "slower", device, k, n, 1e3 * best[int8], 1e3 * best[float32],
                "int8" if faster else "float32")
    return faster
