"""Route an export request's prompt logits through the sampling stack (one checked wrapper).

vLLM 0.32 computes prompt log-probabilities in ``GPUModelRunner._get_prompt_logprobs_dict`` from
raw logits: one ``model.compute_logits`` call per request, on a view of the step's hidden states
that starts at that request's ``query_start_loc``. For the duration of that method we wrap
``compute_logits`` so that views belonging to export requests (``request_keys.EXPORT_KEY``) are
processed with the request's own ``SamplingParams``. vLLM then log-softmaxes, takes the top-k on
the device and copies only those k values per position to the host, exactly as for plain
``prompt_logprobs``. Nothing changes for other requests, and the method is restored afterwards.

The wrapper records which export rows it processed; when the original returns with an export row
that was due this step but never went through ``compute_logits`` as such a view, it raises
``ExportHookError`` instead of letting raw logits go out as if they were processed.

Installed by ``worker_extension.CascadeWorkerExtension.cascade_install_hooks`` (an RPC the gateway
sends to the engines that serve exports), on the live runner's class.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

from cascade.vllm_compat.export_processing import process_prompt_logits
from cascade.vllm_compat.request_keys import is_export_request
from cascade.vllm_compat.version import IncompatibleVllmError

logger = logging.getLogger("cascade.vllm_compat.export_hook")
METHOD = "_get_prompt_logprobs_dict"
_MARK = "_cascade_export_hook"
NOT_A_VIEW = ("vLLM no longer computes prompt logits on a view of the step's hidden states that starts at the "
              "request's query_start_loc (GPUModelRunner._get_prompt_logprobs_dict changed), so the export's "
              "sampling stack was not applied")


class ExportHookError(IncompatibleVllmError):
    """An export request's prompt logits left the engine without Cascade's processing."""


@dataclass(frozen=True)
class ExportRow:
    """One export request's prompt rows in this step's hidden states."""

    req_id: str
    params: Any
    prompt: list[int]
    first_context: int  # row j conditions on prompt[:first_context + j]
    keep: int  # the request's prompt_logprobs
    num_logits: int  # rows vLLM scores this step


def export_rows(runner: Any, num_scheduled_tokens: dict[str, int]) -> dict[int, ExportRow]:
    """Row offset in this step's hidden states → the export request whose prompt logits start there.

    Only requests vLLM scores this step: the same skips as ``_get_prompt_logprobs_dict`` (not
    scheduled, prompt embeddings, or no prompt position left to score)."""
    rows: dict[int, ExportRow] = {}
    for req_id, keep in runner.num_prompt_logprobs.items():
        request = runner.requests.get(req_id)
        num_tokens = num_scheduled_tokens.get(req_id)
        if request is None or num_tokens is None or request.prompt_token_ids is None:
            continue
        if not is_export_request(request.sampling_params):
            continue
        first_context = request.num_computed_tokens + 1
        num_logits = min(num_tokens, len(request.prompt_token_ids) - first_context)
        if num_logits <= 0:
            continue
        index = runner.input_batch.req_id_to_index[req_id]
        offset = int(runner.query_start_loc.np[index])
        rows[offset] = ExportRow(req_id, request.sampling_params, request.prompt_token_ids, first_context, keep,
                                 num_logits)
    return rows


def install_export_hook(runner_cls: type | None = None) -> bool:
    """Wrap ``runner_cls._get_prompt_logprobs_dict`` (default ``GPUModelRunner``, which the CPU
    runner inherits). Returns False when it was already wrapped (idempotent)."""
    if runner_cls is None:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        runner_cls = GPUModelRunner
    original = getattr(runner_cls, METHOD)
    if getattr(original, _MARK, False):
        return False

    @functools.wraps(original)
    def _get_prompt_logprobs_dict(self: Any, hidden_states: Any, num_scheduled_tokens: dict[str, int]) -> Any:
        rows = export_rows(self, num_scheduled_tokens) if self.num_prompt_logprobs else {}
        if not rows:
            return original(self, hidden_states, num_scheduled_tokens)
        model = self.model
        base, stride = hidden_states.storage_offset(), hidden_states.stride(0)
        storage = hidden_states.untyped_storage().data_ptr()
        compute_logits = model.compute_logits
        had_own = "compute_logits" in vars(model)
        processed: set[int] = set()
        why: dict[int, str] = {}

        def processed_logits(states: Any, *args: Any, **kwargs: Any) -> Any:
            logits = compute_logits(states, *args, **kwargs)
            if states.untyped_storage().data_ptr() != storage:
                return logits
            delta = states.storage_offset() - base
            row = rows.get(delta // stride) if delta % stride == 0 else None
            if row is None:
                return logits
            offset = delta // stride
            if states.shape[0] != row.num_logits:
                why[offset] = (f"compute_logits got {states.shape[0]} rows at the request's offset where "
                               f"{row.num_logits} prompt rows were due")
                return logits
            processed.add(offset)
            return process_prompt_logits(logits, row.params, row.prompt, row.first_context, row.keep)

        model.compute_logits = processed_logits
        try:
            result = original(self, hidden_states, num_scheduled_tokens)
        finally:
            if had_own:
                model.compute_logits = compute_logits
            else:
                del model.compute_logits
        missing = sorted(set(rows) - processed)
        if missing:
            reasons = sorted({why.get(offset, NOT_A_VIEW) for offset in missing})
            raise ExportHookError(f"export request(s) {', '.join(rows[o].req_id for o in missing)} were not "
                                  f"processed: {'; '.join(reasons)}")
        return result

    setattr(_get_prompt_logprobs_dict, _MARK, True)
    setattr(runner_cls, METHOD, _get_prompt_logprobs_dict)
    logger.debug("installed the top-k export hook on %s", runner_cls.__name__)
    return True


def is_installed(runner_cls: type) -> bool:
    """Whether ``runner_cls`` resolves ``_get_prompt_logprobs_dict`` to the export hook."""
    return bool(getattr(getattr(runner_cls, METHOD, None), _MARK, False))
