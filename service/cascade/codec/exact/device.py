"""Which device the exact codec computes on (the ``codec_device`` setting)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

from cascade.codec.exact.known_answer import KnownAnswerError, check_known_answer
from cascade.codec.exact.model import ExactLlama
from cascade.codec.exact.runner import single_threaded

M = TypeVar("M")


def resolve_codec_device(setting: str, engine_device: str | None = None) -> torch.device:
    """``auto``: the engines' device (``engine_device``, e.g. vLLM's platform device type), else CUDA
    when this process sees a GPU, else the CPU; ``cpu``/``cuda``: that device, refused with the
    reason when it is not there. Every operation is the same on each device (``exact.audit``; RMSNorm's
    square root is the correctly rounded one everywhere, ``root``); a device that still computes
    other integers fails the start-up known answer (``load_where_integers_agree``)."""
    if setting == "auto":
        found = "cuda" if torch.cuda.is_available() else "cpu"
        setting = engine_device if engine_device in ("cpu", "cuda") else found
    if setting == "cuda" and not torch.cuda.is_available():
        raise ValueError("codec_device is cuda but this process sees no CUDA device")
    if setting not in ("cpu", "cuda"):
        raise ValueError(f"codec_device must be auto, cpu or cuda, not {setting!r}")
    return torch.device(setting)


def load_where_integers_agree(setting: str, device: torch.device, load: Callable[[torch.device], M],
                             check: Callable[[M], None] | None) -> tuple[M, str | None]:
    """Load the exact model on ``device`` (what ``setting`` resolved to). Under ``auto`` a device other
    than the CPU must first pass the drift known answer (``check``): one that computes other integers
    (an operation its kernels round otherwise) gives way to the CPU, and the reason comes back for
    the log. An explicit ``cuda`` is kept (the
    self-test then reports the failure)."""
    model = load(device)
    if setting != "auto" or device.type == "cpu" or check is None:
        return model, None
    try:
        check(model)
    except KnownAnswerError as exc:
        return load(torch.device("cpu")), f"the known answer fails on {device} ({exc}): the codec computes on the CPU"
    return model, None


def load_codec_model(setting: str, path: str | Path, max_positions: int, kernels: str, known_answer: Path | None
                     ) -> tuple[ExactLlama, str | None, bool]:
    """The service's exact model: on the device ``setting`` names (``load_where_integers_agree``, with
    the drift ``known_answer`` when there is one), loaded with one torch thread (``single_threaded``).
    The last value: whether the returned model already passed the known answer (the self-test need
    not run it again)."""
    passed: list[ExactLlama] = []

    def load(device: torch.device) -> ExactLlama:
        return single_threaded(ExactLlama.from_pretrained, path, max_positions, device, kernels)

    def check(model: ExactLlama) -> None:
        assert known_answer is not None
        single_threaded(check_known_answer, model, known_answer)
        passed.append(model)

    model, moved = load_where_integers_agree(setting, resolve_codec_device(setting), load,
                                             check if known_answer is not None else None)
    return model, moved, any(m is model for m in passed)
