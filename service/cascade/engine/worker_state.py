"""Counts of Cascade's live per-request state inside a vLLM worker, for leak checks and metrics.

vLLM mixes ``LiveStateWorkerExtension`` into its worker class (``worker_extension_cls``, a public
engine argument), so the gateway can ask every worker with
``AsyncLLM.collective_rpc("cascade_live_state")``: a named method, so no pickled callables (which
vLLM only accepts with ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``). The counts are read from objects
Cascade itself put there (the static-text proposer) through
duck-typed methods; runner attributes that differ between vLLM versions are read with ``getattr``
so a mismatch reports ``-1`` instead of failing, and the whole query refuses to run on a vLLM
version Cascade was not checked against.
"""

from __future__ import annotations

from typing import Any

WORKER_EXTENSION = "cascade.engine.worker_state.LiveStateWorkerExtension"
RPC_METHOD = "cascade_live_state"
KINDS = ("runner_requests", "batch_rows", "prediction_states", "prediction_debug_logs")


def live_state(worker: Any) -> dict[str, int]:
    """Per-request state a worker holds: vLLM's own (requests, batch rows) and Cascade's."""
    from cascade.plugin import check_vllm_version

    check_vllm_version()
    runner = getattr(worker, "model_runner", None)
    requests = getattr(runner, "requests", None)
    batch = getattr(runner, "input_batch", None)
    counts = {kind: 0 for kind in KINDS}
    counts["runner_requests"] = len(requests) if isinstance(requests, dict) else -1
    req_ids = getattr(batch, "req_ids", None)
    counts["batch_rows"] = len([r for r in req_ids if r is not None]) if req_ids is not None else -1
    drafter: Any = getattr(runner, "drafter", None)
    release = getattr(drafter, "release_finished", None)
    if callable(release):
        # Finished requests leave vLLM's runner without a call to the proposer; their states are
        # dropped at the next propose() or here, so what is counted is state of live requests only
        # plus anything that failed to be released.
        release()
        counts["prediction_states"] = len(drafter.states)
        counts["prediction_debug_logs"] = len(drafter.logs)
    return counts


class LiveStateWorkerExtension:
    """Mixed into vLLM's worker class; adds one RPC-callable method."""

    def cascade_live_state(self) -> dict[str, int]:
        return live_state(self)


def merge_counts(per_worker: list[dict[str, int]]) -> dict[str, int]:
    """One engine's counts: the largest over its workers (tensor-parallel ranks each hold every
    request's state); ``-1`` where any worker could not count."""
    total = {kind: 0 for kind in KINDS}
    for counts in per_worker:
        for kind in KINDS:
            value = int(counts.get(kind, -1))
            total[kind] = -1 if value < 0 or total[kind] < 0 else max(total[kind], value)
    return total
