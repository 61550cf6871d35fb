"""Translate Cascade settings into vLLM engine arguments, one set per engine role."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from cascade.settings import Settings
from cascade.vllm_compat.request_keys import (
    DATASTORE_DIR_KEY,
    DATASTORE_MIB_KEY,
    DRAFT_CROWDING_KEY,
    RESPONSE_CACHE_KEY,
)


class EngineRole(StrEnum):
    """Why an engine exists.

    ``main`` serves plain generation, k-CBS and the top-k export. ``predict`` runs the static-text
    speculative proposer for requests that carry a ``prediction``. The codec runs on no vLLM engine:
    it has its own exact runner (``cascade.codec.exact``).
    """

    MAIN = "main"
    PREDICT = "predict"


CPU_KV_CACHE_MIB = {"main": 512, "predict": 512}
# In-engine hooks each role installs (``vllm_compat.worker_extension``): the prompt-logits export
# serves on the main engine; the static-text proposer's batch binding and the rejection sampler's
# per-request parameters (``draft_sampling_fix``) on the predict engine.
ROLE_HOOKS: dict[EngineRole, tuple[str, ...]] = {EngineRole.MAIN: ("export",),
                                                 EngineRole.PREDICT: ("bind_batch", "draft_sampling")}


def on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def kv_cache_bytes(settings: Settings, role: EngineRole, cpu: bool) -> int | None:
    """An explicit KV cache size, or None to let vLLM size it from the memory fraction.

    On the CPU vLLM takes the fraction of the NUMA node's memory, which is not the machine's, so a
    fraction that starts on one host can leave nothing for the KV cache on another: sizes are fixed.
    """
    explicit = settings.kv_cache_mib
    if explicit is None and cpu:
        explicit = CPU_KV_CACHE_MIB[role.value]
    return None if explicit is None else explicit << 20


def engine_kwargs(settings: Settings, role: EngineRole, *, cpu: bool | None = None) -> dict[str, Any]:
    """Keyword arguments for ``AsyncEngineArgs`` for one role (``cpu``: default, the current platform)."""
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
    if role is EngineRole.PREDICT:
        kwargs["speculative_config"] = {
            "method": "custom_class",
            "model": "cascade.vllm_compat.proposer.StaticTextProposer",
            "num_speculative_tokens": settings.num_speculative_tokens,
        }
        kwargs["per_request_spec_decode_metrics"] = "summary"
        kwargs["additional_config"] = {RESPONSE_CACHE_KEY: settings.prediction_response_cache_tokens,
                                       DRAFT_CROWDING_KEY: settings.prediction_draft_crowding,
                                       DATASTORE_MIB_KEY: settings.prediction_datastore_mib,
                                       DATASTORE_DIR_KEY: settings.prediction_datastore_dir}
        kwargs["gpu_memory_utilization"] = settings.predict_memory_fraction or settings.memory_fraction
    kv_bytes = kv_cache_bytes(settings, role, on_cpu() if cpu is None else cpu)
    if kv_bytes is not None:
        kwargs["kv_cache_memory_bytes"] = kv_bytes
    return kwargs


def engine_roles(settings: Settings) -> list[EngineRole]:
    """The engines a configuration runs (one per enabled role)."""
    roles = [EngineRole.MAIN]
    if settings.enable_predictions:
        roles.append(EngineRole.PREDICT)
    return roles
