"""The reviewed allow-list of every aten operation the codec's decision path may run, and a recorder
that checks a run against it.

The exact model's portability rests on an argument per operation (why its result is the same bits
on every CPU, GPU, thread count and instruction set). That argument lives here, beside the entry it
justifies, and CI (``tests/unit/codec/test_exact_audit.py``) runs prefill, decode steps, logits and
frequency tables of every model of the test matrix under ``OpAudit``: an op, an input dtype, a
conversion, a Python-number operand or a device outside this list fails the build, so a new kernel
cannot slip in unreviewed. ``docs/architecture.md`` carries the same table (``allow_list_markdown``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from cascade.codec.exact import dispatch
from cascade.codec.exact.grid import ACT8, ACT16, BYTE_TERMS, FP32_EXACT, FP32_PIECE_TERMS, FP64_EXACT, RINT_LIMIT
from cascade.codec.exact.int8_gemm import INT32_TERMS

F32, F64, I8, I32, I64, BF16, F16, BOOL = (torch.float32, torch.float64, torch.int8, torch.int32, torch.int64,
                                            torch.bfloat16, torch.float16, torch.bool)


@dataclass(frozen=True)
class Allowed:
    """One reviewed aten op: the tensor dtypes it may see, whether a Python number may be an operand,
    an optional check of its arguments (returns the reason it is wrong, or None), and why it is exact."""

    dtypes: frozenset[torch.dtype]
    why: str
    scalars: bool = False
    check: Callable[[tuple[Any, ...], dict[str, Any]], str | None] | None = None


def _largest(t: torch.Tensor) -> float:
    """The largest magnitude in ``t`` (0 when empty), computed outside the audit."""
    if t.numel() == 0:
        return 0.0
    wide = t.detach().to(torch.int64) if not t.is_floating_point() else t.detach()
    return float(wide.abs().max())


def _integral(t: torch.Tensor) -> bool:
    return not t.is_floating_point() or bool(torch.equal(t, t.trunc()))


def _integers_within(t: torch.Tensor, limit: float, what: str) -> str | None:
    """Why ``t`` is not integers of magnitude ≤ ``limit`` (``what`` they should be), or None."""
    if not _integral(t):
        return f"{what}: not integers"
    largest = _largest(t)
    return None if largest <= limit else f"{what}: magnitude {largest:g} > {limit:g}"


def _product_within(a: torch.Tensor | float, b: torch.Tensor, terms: int, limit: float, what: str) -> str | None:
    """Why a sum of ``terms`` products of ``a``'s and ``b``'s integers may reach ``limit``, or None (``a``
    as a number: the bound of an operand the kernel forms itself, such as attention weights ≤ 2**16)."""
    if not ((isinstance(a, float) or _integral(a)) and _integral(b)):
        return f"{what}: operands not integers"
    bound = (a if isinstance(a, float) else _largest(a)) * _largest(b) * terms
    return None if bound < limit else f"{what}: |a|·|b|·{terms} = {bound:g} ≥ {limit:g}"


def _int_mm_terms(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    k = args[0].shape[-1]
    if k > INT32_TERMS:
        return f"an int8 product over {k} > {INT32_TERMS} terms may overflow int32"
    return (_integers_within(args[0], ACT8, "int8 GEMM activations")
            or _integers_within(args[1], ACT8, "int8 GEMM weights"))


def _byte_product_terms(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    digits, weights, fix_index, fix_value, fix_count = args[:5]
    k = weights.shape[-1]
    if k > BYTE_TERMS:
        return f"a digit sum over {k} > {BYTE_TERMS} terms may overflow int32"
    if (fix_count.numel() and int(fix_count.max()) > k) or not bool(((fix_index >= 0) & (fix_index < k)).all()):
        return "corrections outside the row"
    return (_integers_within(weights, ACT8, "output layer weights")
            or _integers_within(digits, ACT8 + 1, "output layer digits")
            or _integers_within(fix_value, ACT8 + 1, "digit corrections")
            or _product_within(ACT16, weights, k, FP64_EXACT, "Σ m·w"))


def _mm_pieces(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    k = args[0].shape[-1]
    if k > FP32_PIECE_TERMS:
        return f"a float32 product over {k} > {FP32_PIECE_TERMS} terms may round"
    return (_integers_within(args[0], ACT8 + 1, "float32 GEMM activations")
            or _product_within(args[0], args[1], k, FP32_EXACT, "float32 GEMM partial sums"))


def _exact_float64_products(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    return _product_within(args[0], args[1], args[0].shape[-1], FP64_EXACT, "float64 products")


def _exact_float64_sum(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    x = args[0]
    if not x.is_floating_point():
        return None
    if not _integral(x):
        return "a float64 sum of non-integers"
    total = float(x.detach().abs().sum())
    return None if total < FP64_EXACT else f"a float64 sum of integers reaching {total:g} ≥ 2**53"


def _running_sums(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    x, dim = args[0], args[1]
    total = float(x.detach().abs().sum(dim=dim).max()) if x.numel() else 0.0
    return None if total < 2**52 else f"int64 running sums reaching {total:g} ≥ 2**52"


_CASTS: dict[tuple[torch.dtype, torch.dtype], str] = {
    (I8, F32): "int8 weights and activations (magnitude ≤ 127) → float32: exact",
    (I8, F64): "int8 weights (magnitude ≤ 127) and output-layer digits → float64: exact",
    (F64, F32): "activation integers (magnitude ≤ 128) → float32: exact",
    (F32, F64): "GEMM partial sums (integers < 2**24), float32 checkpoint rows → float64: exact",
    (BF16, F64): "embedding rows → float64: every bf16 is exact",
    (F16, F64): "embedding rows → float64: every fp16 is exact",
    (F64, I32): "fixed-point keys/values (integers within the int32 clamp) → int32 cache: exact",
    (F64, I64): "rounded integers (magnitude ≤ 2**50) → int64 indices: exact",
    (F64, I8): "activation integers (magnitude ≤ 127) and output-layer digits (≤ 64) → int8 GEMM operands: exact",
    (I32, F64): "cached integers and int8 GEMM sums (< 2**31) → float64: exact",
    (I32, I64): "cached integers → int64: exact",
    (I64, F64): "integer totals (< 2**53) → float64 for frexp: exact",
    (F64, F64): "no conversion",
    (I64, I64): "no conversion",
}
_CAST_BOUNDS: dict[tuple[torch.dtype, torch.dtype], float] = {
    (I8, F32): ACT8, (I8, F64): ACT8, (F64, F32): ACT8 + 1, (F64, I32): 2**31 - 1, (F64, I64): RINT_LIMIT,
    (F64, I8): ACT8, (I64, F64): FP64_EXACT - 1}
"""The value bounds ``_CASTS`` states, checked on every conversion the audit sees."""


def _convert(src: torch.Tensor, dst: torch.dtype, verb: str) -> str | None:
    if (src.dtype, dst) not in _CASTS:
        return f"{verb} {src.dtype} → {dst} is not reviewed"
    bound = _CAST_BOUNDS.get((src.dtype, dst))
    return None if bound is None else _integers_within(src, bound, f"{verb} {src.dtype} → {dst}")


def _cast(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    return _convert(args[0], kwargs.get("dtype", args[0].dtype), "conversion")


def _copy(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    return _convert(args[1], args[0].dtype, "copy")


_MOVES = "moves, selects, creates or compares values: no arithmetic"
_ALL = frozenset({F32, F64, I8, I32, I64, BF16, F16, BOOL})
_INT = frozenset({I64})

ALLOWED: dict[str, Allowed] = {
    # -- matrix products: exact integer sums, any order ---------------------------------------------
    "aten.mm.default": Allowed(frozenset({F32}), "int8 × int8 (magnitudes ≤ 127; the output layer "
                               "under 64 rows: hi/lo halves ≤ 128) over ≤ 1,040 terms: every partial sum < 2**24, "
                               "exact in float32 in any order",
                               check=_mm_pieces),
    "aten.mm.out": Allowed(frozenset({F64}), "the output layer on the float path from 64 rows: ±32,767 "
                           "activations × int8 weights over K terms, every partial sum an integer < 2**53: "
                           "exact in float64 in any order",
                           check=_exact_float64_products),
    "aten._int_mm.default": Allowed(frozenset({I8}), "int8 × int8 with int32 accumulation (activations ≤ 127, "
                                    "output-layer digits ≤ 64, weights ≤ 127): sums below 127·127·K < 2**31, exact "
                                    "— on shapes whose kernel passed the host's saturation probe (exact.int8_gemm)",
                                    check=_int_mm_terms),
    "aten.bmm.default": Allowed(frozenset({F64}), "attention: q·k over head_dim terms (magnitudes ≤ √(2**53/D)) "
                                "and p·v over the context (p ≤ 2**16, v ≤ 2**53/(2**16·positions) in magnitude): "
                                "< 2**53, exact", check=_exact_float64_products),
    "aten.sum.dim_IntList": Allowed(frozenset({F64, I64}), "sums of integers below 2**53 (squares of int16 rows, "
                                    "attention weights) or int64 table weights: exact in any order",
                                    check=_exact_float64_sum),
    "aten.cumsum.default": Allowed(_INT, "int64 running sums of frequency weights (< 2**52)", scalars=True,
                                   check=_running_sums),
    # -- single correctly rounded IEEE operations -----------------------------------------------------
    "aten.add.Tensor": Allowed(frozenset({F64, I64}), "one IEEE binary64 addition (correctly rounded on every "
                               "device), or int64 arithmetic within bounds", scalars=True),
    "aten.add_.Tensor": Allowed(frozenset({F64, I32}), "rint: + 1.5·2**52 (one correctly rounded addition); the "
                                "output layer's int8 GEMM digit sums (int32) into exact integers < 2**53",
                                scalars=True),
    "aten.sub.Tensor": Allowed(frozenset({F64, I64}), "one IEEE binary64 subtraction, or int64", scalars=True),
    "aten.sub_.Tensor": Allowed(frozenset({F64}), "rint: − 1.5·2**52 (exact)", scalars=True),
    "aten.sub.out": Allowed(frozenset({F64}), "max score − score: one IEEE subtraction"),
    "aten.rsub.Scalar": Allowed(_INT, "int64 id reversal (vocab − 1 − key bits)", scalars=True),
    "aten.mul.Tensor": Allowed(frozenset({F64, I64}), "one IEEE binary64 multiplication (by a tensor or a number: "
                               "the same correctly rounded product on every device), or int64 within bounds",
                               scalars=True),
    "aten.mul_.Tensor": Allowed(frozenset({F64}), "score difference × grid scale: one IEEE multiplication",
                                scalars=True),
    "aten.div.Tensor": Allowed(frozenset({F64}), "one IEEE binary64 division by a same-device TENSOR (a Python "
                               "number divisor is refused: CUDA multiplies by its reciprocal instead)"),
    "aten.floor_divide.default": Allowed(_INT, "int64 floor division of the CDF (exact integer arithmetic)"),
    "aten.sqrt.default": Allowed(frozenset({F64}), ("a GPU's float64 square root, correctly rounded as IEEE "
                                 "defines it (on the CPU the model takes numpy's, codec.exact.root: torch's CPU "
                                 "sqrt is MKL's vector root, another variant on some CPUs, used only to read an "
                                 "earlier release's segment again, root.machine)")),
    "aten.abs.default": Allowed(frozenset({F64}), "exact"),
    "aten.amax.default": Allowed(frozenset({F64, I64}), "a maximum: exact, order independent"),
    "aten.max.default": Allowed(_INT, "a maximum: exact"),
    "aten.clamp.default": Allowed(frozenset({F64, I64}), "comparison and selection: exact", scalars=True),
    "aten.clamp_.default": Allowed(frozenset({F64, I64}), "comparison and selection: exact", scalars=True),
    "aten.where.self": Allowed(frozenset({F64, BOOL}), "selection: exact"),
    "aten.gt.Scalar": Allowed(frozenset({F64}), "comparison: exact", scalars=True),
    "aten.gt.Tensor": Allowed(_INT, "comparison: exact"),
    "aten.masked_fill_.Scalar": Allowed(frozenset({F64, BOOL}), "masked scores set to −2**60: exact", scalars=True),
    "aten.frexp.Tensor": Allowed(frozenset({F64}), "the exponent of an exact integer: exact"),
    "aten.__rshift__.Scalar": Allowed(_INT, "int64 shift", scalars=True),
    "aten.__rshift__.Tensor": Allowed(_INT, "int64 shift"),
    "aten.bitwise_right_shift_.Tensor_Scalar": Allowed(_INT, "int64 shift", scalars=True),
    "aten.bitwise_and.Scalar": Allowed(_INT, "int64 mask", scalars=True),
    "aten.topk.default": Allowed(_INT, "top-k of unique int64 keys: no ties, so the same on every device",
                                 scalars=True),
    # -- conversions (each pair reviewed in _CASTS) ---------------------------------------------------
    "aten._to_copy.default": Allowed(_ALL, "dtype conversions of values exactly representable in the target",
                                     check=_cast),
    "aten.copy_.default": Allowed(_ALL, "writes of values exactly representable in the target", check=_copy),
    # -- moves, views, creation -----------------------------------------------------------------------
    **{name: Allowed(_ALL, _MOVES, scalars=True) for name in (
        "aten.index.Tensor", "aten.index_put_.default", "aten.cat.default", "aten.repeat.default",
        "aten.clone.default", "aten.view.default", "aten._unsafe_view.default", "aten.expand.default",
        "aten.slice.Tensor", "aten.select.int", "aten.transpose.int", "aten.unsqueeze.default",
        "aten.alias.default", "aten.detach.default", "aten.lift_fresh.default", "aten._local_scalar_dense.default",
        "aten.empty.memory_format", "aten.empty_like.default", "aten.zeros.default", "aten.ones.default",
        "aten.arange.default", "aten.arange.start", "aten.arange.start_step", "aten.triu_.default",
        "aten.t.default", "aten.squeeze.dim", "aten.permute.default", "aten.new_zeros.default",
        "aten.gather.default", "aten.eq.Tensor", "aten.any.dim", "aten.argmax.default", "aten.lt.Tensor",
        "aten.full_like.default", "aten.zeros_like.default", "aten.ones_like.default", "aten.fill_.Scalar",
        "aten.bitwise_not.default", "aten.logical_not.default", "aten.le.Scalar", "aten.ge.Scalar")},
}


def _attended(t: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """``fused.attend_cached(q, k, v, keys, values, …)``: the new keys and values fit the cache, and its
    q·k and p·v sums (p ≤ 2**16, over every cached position) stay below 2**53."""
    q, k, v, keys, values = t[:5]
    limit = 2**31 - 1 if keys.dtype == I32 else FP64_EXACT - 1
    return (_integers_within(k, limit, "cached keys") or _integers_within(v, limit, "cached values")
            or _product_within(q, keys, q.shape[-1], FP64_EXACT, "q·k")
            or _product_within(float(1 << 16), values, values.shape[2], FP64_EXACT, "p·v"))


def _exact_sums(t: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    return _integers_within(t[0], FP64_EXACT - 1, "integer sums")


def _residual_sums(t: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    return _integers_within(t[1], FP64_EXACT - 1, "integer sums")


_KERNEL_CHECKS: dict[str, Callable[[tuple[Any, ...], dict[str, Any]], str | None]] = {
    "fused.attend_cached": _attended, "fused.qkv": _exact_sums, "fused.residual": _residual_sums,
    "fused.silu_quantize": _exact_sums, "fused.total_logits": _exact_sums}

KERNELS: dict[str, Allowed] = {
    "root.machine_root": Allowed(frozenset({F64}), "off the CPU, inside root.machine() only (a second reading of "
                                "an earlier release's segment), RMSNorm's per-row roots taken by the host's "
                                "torch.sqrt (the machine's variant): one float64 per row copied to the CPU and "
                                "back, exactly; its ops are checked, not their device"),
    "fused.int8_product": Allowed(frozenset({I8, I32}), "a few rows' int8 products streamed over the weights "
                                  "(numba): int8 × int8 summed as integers, in any order and instruction set; "
                                  f"a sum of K ≤ {INT32_TERMS} products, each at most 127·127, stays below 2**31, so "
                                  "the int32 result is exact",
                                  check=_int_mm_terms),
    "fused.byte_product": Allowed(frozenset({I8, I64}), "the output layer's rows as two int8 digits h·2**8 + l "
                                  "and corrections (numba): int8 × int8 digit sums below 2**31 (K ≤ "
                                  f"{BYTE_TERMS}, digits −128…127, weights ±127), 2**8·Σh·w + Σl·w + Σ correction·w "
                                  "in int64 below 2**53, in any order and instruction set: exact",
                                  check=_byte_product_terms),
    "frequencies.compiled_tables": Allowed(frozenset({I64}), "the frequency tables of frequencies.py in one loop "
                                           "per row (numba): int64 arithmetic within its bounds, nothing rounds"),
    "frequencies.compiled_escape_tables": Allowed(frozenset({I64}), "the escape tables of frequencies.py (container "
                                                  "version 4) in one loop per row (numba): int64 arithmetic within "
                                                  "its bounds, nothing rounds"),
    **{f"fused.{name}": Allowed(dtypes, "the torch path's elementwise operations in its order, compiled without "
                                        f"fast-math (machine code checked for FMA at load): {why}",
                                check=_KERNEL_CHECKS.get(f"fused.{name}"))
       for name, dtypes, why in (
           ("mean_squares", frozenset({F64}), "RMSNorm's int16 grid and the exact sum of its squares, ÷ n, "
                                              "× step², + eps"),
           ("norm_quantize", frozenset({F64}), "x ÷ root × gain (the root from root.root), then the ±127 grid"),
           ("residual", frozenset({F64, I32}), "x + acc·(step·scale) (+ bias), then the next RMSNorm's mean square"),
           ("silu_quantize", frozenset({F64, I32}), "gate·sigmoid-table(rint(gate·2**10))·up, then the ±127 grid"),
           ("qkv", frozenset({F64, I32, I64}), "RoPE products and differences from the tables, rint onto the "
                                               "2**-10 grids, clamped"),
           ("attend_cached", frozenset({F64, I32, I64}), "keys and values into the int32 cache (exact "
            "conversion); q·k and p·v as sums of integer products below 2**53 (exact in any order: the only "
            "loops compiled with reassociation, never contraction); masking, max, (top − s)·scale, rint, "
            "exp-table lookup, exact integer sum, p·v ÷ (Σp · 2**10), then the ±127 grid"),
           ("norm_digits", frozenset({F64}), "x ÷ root × gain, the ±32,767 grid and its three int8 digits "
                                             "(products by 2**-7, rint)"),
           ("norm_bytes", frozenset({F64, I64}), "x ÷ root × gain, the ±32,767 grid, its two int8 digits "
                                                 "(⌊(m + 128)·2**-8⌋ capped at 127, m − 256·h capped at 127) and "
                                                 "the capped remainder as a correction"),
           ("total_logits", frozenset({F64}), "the output layer's exact integer products (float64, below "
                                              "2**53), × (step·scale), rint"),
           ("digit_logits", frozenset({I32, F64}), "the int8 GEMM's int32 products of the three digit rows, "
                                                   "(a·128 + b)·128 + c in int64 (below 2**46: exact, the "
                                                   "float64 total), × (step·scale), rint"),
       )},
}
"""The project's own compiled kernels (dispatch never sees them; each reports its call to ``observers``)."""


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def _has_number(args: tuple[Any, ...]) -> bool:
    return any(isinstance(a, float) or (isinstance(a, int) and not isinstance(a, bool)) for a in args[1:])


class OpAudit(TorchDispatchMode):
    """Records every aten call inside the ``with`` block and every way it breaks ``ALLOWED``
    (``violations``, one line per distinct problem); ``device``: the device every tensor must be on."""

    def __init__(self, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.device = None if device is None else torch.device(device)
        self.calls: dict[str, int] = {}
        self.violations: set[str] = set()

    def __enter__(self) -> OpAudit:
        dispatch.observers.append(self._kernel)
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        dispatch.observers.remove(self._kernel)
        super().__exit__(*exc)

    def _kernel(self, name: str, tensors: tuple[torch.Tensor, ...]) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        entry = KERNELS.get(name)
        if entry is None:
            self.violations.add(f"{name}: not a reviewed kernel")
        elif bad := sorted({str(t.dtype) for t in tensors} - {str(d) for d in entry.dtypes}):
            self.violations.add(f"{name}: dtype {', '.join(bad)} not reviewed")
        elif entry.check is not None:
            with _disable_current_modes():  # the check's own ops are not the decision path's
                reason = entry.check(tensors, {})
            if reason:
                self.violations.add(f"{name}: {reason}")
        self._check_device(name, list(tensors))

    def _check_device(self, name: str, tensors: list[torch.Tensor]) -> None:
        if self.device is not None and not dispatch.on_host():
            for t in tensors:
                if t.device.type != self.device.type or self.device.index not in (None, t.device.index):
                    self.violations.add(f"{name}: a tensor on {t.device}, not {self.device}")

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        name = str(func)
        self.calls[name] = self.calls.get(name, 0) + 1
        entry = ALLOWED.get(name)
        tensors = list(_tensors(args)) + list(_tensors(list(kwargs.values())))
        if entry is None:
            self.violations.add(f"{name}: not on the allow-list")
        else:
            bad = sorted({str(t.dtype) for t in tensors} - {str(d) for d in entry.dtypes})
            if bad:
                self.violations.add(f"{name}: dtype {', '.join(bad)} not reviewed")
            if not entry.scalars and _has_number(args):
                self.violations.add(f"{name}: a Python number operand (only same-device tensors)")
            reason = entry.check(args, kwargs) if entry.check else None
            if reason:
                self.violations.add(f"{name}: {reason}")
        self._check_device(name, tensors)
        return func(*args, **kwargs)


def allow_list_markdown() -> str:
    """The allow-list as the Markdown table ``docs/architecture.md`` carries."""
    lines = ["| aten op | dtypes | Python number operand | why it is the same on every device |", "|---|---|---|---|"]
    moves = sorted(name for name, e in ALLOWED.items() if e.why == _MOVES)
    for name, e in ALLOWED.items():
        if e.why == _MOVES:
            continue
        dtypes = ", ".join(sorted(str(d).removeprefix("torch.") for d in e.dtypes))
        lines.append(f"| `{name}` | {dtypes} | {'yes' if e.scalars else 'no'} | {e.why} |")
    lines.append(f"| {', '.join(f'`{n}`' for n in moves)} | any | yes | {_MOVES} |")
    for name, e in KERNELS.items():
        dtypes = ", ".join(sorted(str(d).removeprefix("torch.") for d in e.dtypes))
        lines.append(f"| `{name}` (project kernel) | {dtypes} | no | {e.why} |")
    return "\n".join(lines)


def cast_list_markdown() -> str:
    """The reviewed conversions (``aten._to_copy`` / ``aten.copy_``) as a Markdown table."""
    rows = [f"| {str(a).removeprefix('torch.')} → {str(b).removeprefix('torch.')} | {why} |"
            for (a, b), why in _CASTS.items()]
    return "\n".join(["| conversion | why it is exact |", "|---|---|", *rows])


if __name__ == "__main__":
    print(allow_list_markdown() + "\n\n" + cast_list_markdown())
