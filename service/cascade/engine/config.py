"""Translate Cascade settings into vLLM engine arguments, one set per engine role."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from cascade.settings import Settings


class EngineRole(StrEnum):
    """Why an engine exists.

    ``main`` serves plain generation, the codec, k-CBS and the top-k export: everything that uses
    logits processors, which vLLM refuses together with speculative decoding. ``predict`` runs the
    static-text speculative proposer for requests that carry a ``prediction``.
    """

    MAIN = "main"
    PREDICT = "predict"


def engine_kwargs(settings: Settings, role: EngineRole) -> dict[str, Any]:
    """Keyword arguments for ``AsyncEngineArgs`` for one role."""
    kwargs: dict[str, Any] = {
        "model": settings.model,
        "served_model_name": settings.model_name,
        "dtype": settings.dtype,
        "max_model_len": settings.max_model_len,
        "gpu_memory_utilization": settings.memory_fraction,
        "enforce_eager": settings.enforce_eager,
        "tensor_parallel_size": settings.tensor_parallel_size,
        "seed": settings.engine_seed,
        "max_num_seqs": settings.max_num_seqs,
        "max_logprobs": -1,
        "enable_log_requests": False,
        "disable_log_stats": True,
    }
    return kwargs
