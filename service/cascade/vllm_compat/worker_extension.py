"""Cascade's RPC methods inside a vLLM worker: live-state counts and hook installation.

vLLM mixes ``CascadeWorkerExtension`` into its worker class (``worker_extension_cls``, a public
engine argument, given ``WORKER_EXTENSION``), so the gateway reaches every worker with
``AsyncLLM.collective_rpc(name, args=...)``: named methods, so no pickled callables (which vLLM only
accepts with ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``). vLLM refuses an extension whose attribute
names clash with the worker's, hence the ``cascade_`` prefix.

- ``cascade_install_hooks(names)``: after an engine starts, the gateway installs the hooks that
  engine's role needs (``"export"`` on the engine serving top-k exports; ``"bind_batch"`` and
  ``"draft_sampling"``, the rejection sampler's per-request parameters on the CPU, on the one
  running the static-text proposer). Each first checks the live runner has every attribute the
  hook reads and raises ``IncompatibleVllmError`` naming what is missing.
- ``cascade_prediction_usage(request_id, answer_tokens)``: the prediction tokens drafted and
  accepted within a finished request's answer (``cascade.predict.usage``), from the proposer's
  ledger; None where this worker runs no proposer or never saw the request.
- ``cascade_live_state()``: counts of per-request state for leak checks and metrics. Runner
  attributes are read with ``getattr`` so a mismatch reports ``-1`` instead of failing.

Importing this module imports neither torch nor vLLM (the gateway reads its constants).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from cascade.vllm_compat.version import IncompatibleVllmError, check_vllm_version

WORKER_EXTENSION = "cascade.vllm_compat.worker_extension.CascadeWorkerExtension"
LIVE_STATE_RPC = "cascade_live_state"
INSTALL_HOOKS_RPC = "cascade_install_hooks"
PREDICTION_USAGE_RPC = "cascade_prediction_usage"
HOOKS = ("export", "bind_batch", "draft_sampling")
KINDS = ("runner_requests", "batch_rows", "prediction_states", "prediction_debug_logs", "prediction_response_tokens",
         "prediction_datastore_ngrams")
_MISSING = object()

# What each hook reads on the live runner: (dotted attribute path, required type or None, callable?).
HOOK_REQUIREMENTS: dict[str, tuple[tuple[str, type | None, bool], ...]] = {
    "export": (
        ("_get_prompt_logprobs_dict", None, True),
        ("num_prompt_logprobs", dict, False),
        ("requests", dict, False),
        ("input_batch.req_id_to_index", None, False),
        ("query_start_loc.np", None, False),
        ("model.compute_logits", None, True),
    ),
    "bind_batch": (
        ("propose_draft_token_ids", None, True),
        ("_input_fits_in_drafter", None, True),
        ("drafter.bind_batch", None, True),
        ("input_batch.req_ids", None, False),
        ("requests", dict, False),
    ),
    "draft_sampling": (
        ("rejection_sampler", None, False),
    ),
}


def _lookup(obj: Any, path: str) -> Any:
    for part in path.split("."):
        try:
            obj = getattr(obj, part)
        except Exception:  # a property may raise anything (vLLM's buffers raise on .np without numpy)
            return _MISSING
    return obj


def missing_for(runner: Any, name: str) -> list[str]:
    """What ``runner`` lacks among the attributes hook ``name`` reads (empty: it can be installed)."""
    if name not in HOOK_REQUIREMENTS:
        raise ValueError(f"unknown Cascade hook {name!r}; known: {', '.join(HOOKS)}")
    if runner is None:
        return ["model_runner"]
    missing = []
    for path, kind, must_call in HOOK_REQUIREMENTS[name]:
        value = _lookup(runner, path)
        if value is _MISSING:
            missing.append(f"{path} (absent)")
        elif kind is not None and not isinstance(value, kind):
            missing.append(f"{path} (a {type(value).__name__}, expected a {kind.__name__})")
        elif must_call and not callable(value):
            missing.append(f"{path} (not callable)")
    return missing


def _installers() -> dict[str, tuple[Callable[[type], bool], Callable[[type], bool]]]:
    from cascade.vllm_compat import bind_batch_hook, draft_sampling_fix, export_hook

    return {
        "export": (export_hook.install_export_hook, export_hook.is_installed),
        "bind_batch": (bind_batch_hook.install_bind_batch_hook, bind_batch_hook.is_installed),
        "draft_sampling": (lambda _cls: draft_sampling_fix.install(), lambda _cls: draft_sampling_fix.is_installed()),
    }


def install_hooks(runner: Any, names: Iterable[str]) -> list[str]:
    """Check then install each named hook on ``type(runner)``; returns the names installed (including
    ones that already were). Every requirement is checked before anything is installed."""
    names = list(names)
    unknown = [n for n in names if n not in HOOK_REQUIREMENTS]
    if unknown:
        raise ValueError(f"unknown Cascade hook(s) {', '.join(map(repr, unknown))}; known: {', '.join(HOOKS)}")
    where = "the worker" if runner is None else f"model runner {type(runner).__name__}"
    problems = [f"the {name} hook cannot be installed: {where} lacks {', '.join(missing)}"
                for name in names if (missing := missing_for(runner, name))]
    if problems:
        raise IncompatibleVllmError("; ".join(problems))
    installers = _installers()
    runner_cls = type(runner)
    for name in names:
        install, installed = installers[name]
        install(runner_cls)
        if not installed(runner_cls):
            raise IncompatibleVllmError(f"the {name} hook did not take effect on {runner_cls.__name__}")
    return names


def live_state(worker: Any) -> dict[str, int]:
    """Per-request state a worker holds: vLLM's own (requests, batch rows) and Cascade's."""
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
        responses = getattr(drafter, "responses", None)
        counts["prediction_response_tokens"] = responses.tokens if responses is not None else 0
        datastore = getattr(drafter, "datastore", None)
        counts["prediction_datastore_ngrams"] = datastore.ngrams if datastore is not None else 0
    return counts


class CascadeWorkerExtension:
    """Mixed into vLLM's worker class; adds Cascade's RPC-callable methods."""

    def cascade_live_state(self) -> dict[str, int]:
        return live_state(self)

    def cascade_prediction_usage(self, request_id: str, answer_tokens: int) -> tuple[int, int] | None:
        usage = getattr(getattr(getattr(self, "model_runner", None), "drafter", None), "prediction_usage", None)
        return usage(request_id, answer_tokens) if callable(usage) else None

    def cascade_install_hooks(self, names: list[str]) -> list[str]:
        check_vllm_version()
        return install_hooks(getattr(self, "model_runner", None), names)


def merge_counts(per_worker: list[dict[str, int]]) -> dict[str, int]:
    """One engine's counts: the largest over its workers (tensor-parallel ranks each hold every
    request's state); ``-1`` where any worker could not count."""
    total = {kind: 0 for kind in KINDS}
    for counts in per_worker:
        for kind in KINDS:
            value = int(counts.get(kind, -1))
            total[kind] = -1 if value < 0 or total[kind] < 0 else max(total[kind], value)
    return total


def check_installed(per_worker: Sequence[Any], names: Sequence[str]) -> None:
    """Check what ``collective_rpc(INSTALL_HOOKS_RPC, args=(names,))`` returned: every worker
    installed every requested hook."""
    wanted = list(names)
    for rank, got in enumerate(per_worker):
        if list(got) != wanted:
            raise IncompatibleVllmError(f"worker {rank} installed {list(got)} of the hooks {wanted}")


async def install_engine_hooks(engine: Any, names: Sequence[str], timeout: float | None = None) -> None:
    """Install ``names`` in every worker of a started ``AsyncLLM`` (``collective_rpc``), or raise
    ``IncompatibleVllmError``. vLLM 0.32 re-raises a worker's exception as a plain ``Exception``
    whose message quotes the worker's (its type is lost), so the cause is kept as text."""
    try:
        per_worker = await engine.collective_rpc(INSTALL_HOOKS_RPC, timeout=timeout, args=(list(names),))
    except Exception as exc:
        raise IncompatibleVllmError(f"installing Cascade's vLLM hooks {list(names)} failed: {exc}") from exc
    check_installed(per_worker, names)
