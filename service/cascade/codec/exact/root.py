"""RMSNorm's square root: the one operation of ``exact-llama-1`` that a machine could compute its own way.

Every other operation of the exact model is a basic IEEE one, the same on every machine. The square
root is too — IEEE 754 defines it correctly rounded — but torch's CPU ``sqrt`` on float64 is MKL's
vector square root: within an ulp, not always the correctly rounded root, and not the same on every
x86 machine (measured 2026-11-25/26: an Intel Xeon's AVX-512 and AVX2 paths disagree with each other
and with the correctly rounded root on 0.7–1.4 % of inputs; an AMD EPYC with AVX-512 on 1.3 %, as
another variant again). Releases up to 2026-11-26 computed with that machine root, so a container
written on one machine could, at a rare position, decode differently on another (its segment then
failed its checksum: a clear error, never wrong bytes).

So the model computes with the correctly rounded root (``correctly_rounded_root``: numpy's IEEE
``sqrt`` on the host, CUDA's own ``sqrt`` on a GPU, which is correctly rounded for float64): the
same roots, and so the same integers, on every machine and device. The numerics keep their name:
a root variant changes an integer only where a value lies within an ulp of a rounding boundary
(about 2**-44 per activation, ~2**-29 per token of a 30-layer model), so a container written with
either root opens with the other except at such a rare position. For containers an earlier release
wrote on this very machine, the reader decodes a segment that fails its checksum once more with this
machine's root (``machine()``, ``codec.pipeline``): what an earlier release wrote here keeps
decoding here byte for byte.

- ``root(squares)``: the correctly rounded root, or ``machine_root`` inside ``machine()`` (of a tensor or
  a numpy array).
- ``variant()``: a digest of this machine's root on a fixed sample, reported beside the known answer;
  ``machine_is_correctly_rounded()``: whether it equals the correctly rounded root there (then the
  second reading is skipped: it could not differ).
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import overload

import numpy as np
import torch

from cascade.codec.exact import dispatch

_MACHINE: ContextVar[bool] = ContextVar("cascade_machine_root", default=False)


def machine_root(squares: torch.Tensor) -> torch.Tensor:
    """Earlier releases' root: torch's CPU ``sqrt`` (MKL's, this machine's variant); off the CPU taken
    on the host (one float64 per row copied each way)."""
    if squares.device.type == "cpu":
        return torch.sqrt(squares)
    with dispatch.host_step("root.machine_root", squares):
        return torch.sqrt(squares.cpu()).to(squares.device)


@overload
def correctly_rounded_root(squares: np.ndarray) -> np.ndarray: ...
@overload
def correctly_rounded_root(squares: torch.Tensor) -> torch.Tensor: ...
def correctly_rounded_root(squares: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
    """IEEE's correctly rounded square root: numpy's on the CPU (the hardware instruction, not MKL's
    vector routine), CUDA's own on a GPU (correctly rounded for float64). One answer on every machine.
    A numpy array (the compiled kernels' currency) is answered as an array."""
    if isinstance(squares, np.ndarray):
        return np.sqrt(squares)
    if squares.device.type != "cpu":
        return torch.sqrt(squares)
    return torch.from_numpy(np.sqrt(squares.detach().to(torch.float64).contiguous().numpy()))


@overload
def root(squares: np.ndarray) -> np.ndarray: ...
@overload
def root(squares: torch.Tensor) -> torch.Tensor: ...
def root(squares: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
    """The model's root. A CPU float64 array (the compiled kernels' currency) is answered as an array,
    without two conversions through torch where the correctly rounded root takes it directly (a one-row
    decode step takes 61 roots)."""
    if not machine_active():
        return correctly_rounded_root(squares)
    if isinstance(squares, np.ndarray):
        return machine_root(torch.from_numpy(squares)).numpy()
    return machine_root(squares)


def machine_active() -> bool:
    """Whether this context computes with this machine's root (``machine``)."""
    return _MACHINE.get()


@contextmanager
def machine() -> Iterator[None]:
    """Compute with this machine's root in this context (a second reading of an earlier release's
    segment that failed its checksum)."""
    token = _MACHINE.set(True)
    try:
        yield
    finally:
        _MACHINE.reset(token)


def _sample() -> torch.Tensor:
    """Fixed mean squares spanning the magnitudes RMSNorm sees (2**-20 … 2**19), 4,096 values built
    with Python's exact float operations."""
    values = [math.ldexp(1.0 + (i * 0.6180339887498949) % 1.0, i % 40 - 20) for i in range(4096)]
    return torch.tensor(values, dtype=torch.float64)


def variant() -> str:
    """Digest of this machine's root on a fixed sample: machines that print the same computed the
    same roots in earlier releases."""
    return hashlib.sha256(machine_root(_sample()).numpy().tobytes()).hexdigest()[:16]


@functools.cache
def machine_is_correctly_rounded() -> bool:
    """Whether this machine's root equals the correctly rounded one on the fixed sample."""
    sample = _sample()
    return torch.equal(machine_root(sample), correctly_rounded_root(sample))
