"""RMSNorm's square root: the one operation of ``exact-llama-1`` whose result depends on the machine.

``exact-llama-1`` takes RMSNorm's per-row root with torch's CPU ``sqrt``, which is MKL's vector
square root: within an ulp, not always the correctly rounded root, and — measured 2026-11-25 — not
the same on every x86 machine. On one AVX-512 host (Xeon with AVX512-IFMA/VNNI) MKL's AVX-512 path
and its AVX2 path (``MKL_CBWR=AVX2``) disagree on 0.7 % of float64 inputs, and neither reproduces
the roots of the machine the shipped known answers were recorded on. Every other operation is a
basic IEEE one: with the root replaced by the correctly rounded one, the hidden states are bit for
bit the same under both MKL paths.

So a root variant changes pre-rounding values everywhere (the float64 hidden states), but an integer
only when a value lies within an ulp of a rounding boundary (about 2**-44 per activation, ~2**-29 per
token of a 30-layer model): containers still open across machines, and where one rare position
differs, the segment's checksum fails and the reader says so (never wrong bytes).

This module keeps both roots behind one function:
- ``root(squares)``: the root the model computes with — ``exact-llama-1``'s (torch's ``sqrt`` on the
  host) unless ``neutral()`` is active in this context.
- ``neutral()``: the correctly rounded root (numpy's IEEE ``sqrt``), the same on every machine. The
  drift known answer traces the model under it, so it pins every *other* operation bit for bit on
  any host, and reports this machine's root variant (``variant()``) beside it instead of refusing a
  machine only because its MKL takes another code path.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np
import torch

from cascade.codec.exact import dispatch

_NEUTRAL: ContextVar[bool] = ContextVar("cascade_neutral_root", default=False)


def machine_root(squares: torch.Tensor) -> torch.Tensor:
    """``exact-llama-1``'s root: torch's CPU ``sqrt``; off the CPU taken on the host (one float64 per
    row copied each way), so any device computes this machine's roots."""
    if squares.device.type == "cpu":
        return torch.sqrt(squares)
    with dispatch.host_step("root.machine_root", squares):
        return torch.sqrt(squares.cpu()).to(squares.device)


def correctly_rounded_root(squares: torch.Tensor) -> torch.Tensor:
    """IEEE's correctly rounded square root (numpy's, on the host): one answer on every machine."""
    host = squares.detach().to("cpu", torch.float64).contiguous()
    return torch.from_numpy(np.sqrt(host.numpy())).to(squares.device)


def root(squares: torch.Tensor) -> torch.Tensor:
    return correctly_rounded_root(squares) if _NEUTRAL.get() else machine_root(squares)


@contextmanager
def neutral() -> Iterator[None]:
    """Compute with the correctly rounded root in this context (the drift known answer's trace)."""
    token = _NEUTRAL.set(True)
    try:
        yield
    finally:
        _NEUTRAL.reset(token)


def _sample() -> torch.Tensor:
    """Fixed mean squares spanning the magnitudes RMSNorm sees (2**-20 … 2**19), 4,096 values built
    with Python's exact float operations."""
    values = [math.ldexp(1.0 + (i * 0.6180339887498949) % 1.0, i % 40 - 20) for i in range(4096)]
    return torch.tensor(values, dtype=torch.float64)


def variant() -> str:
    """Digest of this machine's ``exact-llama-1`` roots on a fixed sample: machines that print the same
    compute the same roots (and so the same pre-rounding values everywhere)."""
    return hashlib.sha256(machine_root(_sample()).numpy().tobytes()).hexdigest()[:16]
