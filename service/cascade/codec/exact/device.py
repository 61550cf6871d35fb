"""Which device the exact codec computes on (the ``codec_device`` setting)."""

from __future__ import annotations

import torch


def resolve_codec_device(setting: str, engine_device: str | None = None) -> torch.device:
    """``auto``: the engines' device (``engine_device``, e.g. vLLM's platform device type), else CUDA
    when this process sees a GPU, else the CPU; ``cpu``/``cuda``: that device, refused with the
    reason when it is not there. Every operation but RMSNorm's square root is the same on each device
    (``exact.audit``); a device whose square root differs from the CPU's fails the start-up known
    answer and leaves the codec off with the reason (docs/architecture.md, "The square root")."""
    if setting == "auto":
        found = "cuda" if torch.cuda.is_available() else "cpu"
        setting = engine_device if engine_device in ("cpu", "cuda") else found
    if setting == "cuda" and not torch.cuda.is_available():
        raise ValueError("codec_device is cuda but this process sees no CUDA device")
    if setting not in ("cpu", "cuda"):
        raise ValueError(f"codec_device must be auto, cpu or cuda, not {setting!r}")
    return torch.device(setting)
