"""Route an export request's prompt logits through the sampling stack (one version-checked wrapper).

vLLM 0.32 computes prompt log-probabilities in ``GPUModelRunner._get_prompt_logprobs_dict`` from
raw logits: one ``model.compute_logits`` call per request, on a slice of the step's hidden states
that starts at that request's ``query_start_loc``. For the duration of that method we wrap
``compute_logits`` so that slices belonging to export requests (``extra_args.cascade_export``) are
processed with the request's own ``SamplingParams``. vLLM then log-softmaxes, takes the top-k on
the device and copies only those k values per position to the host, exactly as for plain
``prompt_logprobs``. Nothing changes for other requests, and the method is restored afterwards.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from cascade.export.processing import is_export_request, process_prompt_logits

logger = logging.getLogger("cascade.export.hook")
_MARK = "_cascade_export_hook"


def _export_rows(runner: Any, num_scheduled_tokens: dict[str, int]) -> dict[int, tuple[Any, list[int], int, int]]:
    """Row offset in this step's hidden states → (params, prompt ids, first context length, k)."""
    rows: dict[int, tuple[Any, list[int], int, int]] = {}
    for req_id in runner.num_prompt_logprobs:
        request = runner.requests.get(req_id)
        if request is None or req_id not in num_scheduled_tokens or request.prompt_token_ids is None:
            continue
        if not is_export_request(request.sampling_params):
            continue
        index = runner.input_batch.req_id_to_index[req_id]
        offset = int(runner.query_start_loc.np[index])
        rows[offset] = (request.sampling_params, request.prompt_token_ids, request.num_computed_tokens + 1,
                        runner.num_prompt_logprobs[req_id])
    return rows


def install_export_hook() -> bool:
    """Wrap ``GPUModelRunner._get_prompt_logprobs_dict`` (the CPU runner inherits it). Idempotent."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner._get_prompt_logprobs_dict
    if getattr(original, _MARK, False):
        return False

    @functools.wraps(original)
    def _get_prompt_logprobs_dict(self: Any, hidden_states: Any, num_scheduled_tokens: dict[str, int]) -> Any:
        rows = _export_rows(self, num_scheduled_tokens) if self.num_prompt_logprobs else {}
        if not rows:
            return original(self, hidden_states, num_scheduled_tokens)
        model = self.model
        base, stride = hidden_states.storage_offset(), hidden_states.stride(0)
        compute_logits = model.compute_logits
        had_own = "compute_logits" in vars(model)

        def processed_logits(states: Any, *args: Any, **kwargs: Any) -> Any:
            logits = compute_logits(states, *args, **kwargs)
            spec = rows.get((states.storage_offset() - base) // stride)
            return logits if spec is None else process_prompt_logits(logits, *spec)

        model.compute_logits = processed_logits
        try:
            return original(self, hidden_states, num_scheduled_tokens)
        finally:
            if had_own:
                model.compute_logits = compute_logits
            else:
                del model.compute_logits

    setattr(_get_prompt_logprobs_dict, _MARK, True)
    GPUModelRunner._get_prompt_logprobs_dict = _get_prompt_logprobs_dict
    logger.debug("installed the top-k export hook")
    return True
