"""The one piece of vLLM internals the static-text proposer needs: which request sits in each row.

vLLM 0.32's ``custom_class`` proposer API passes rows but no request ids. Before each
``propose_draft_token_ids`` call we hand the drafter the runner's current ``input_batch.req_ids``
and ``requests`` (which hold each request's ``SamplingParams.extra_args``). The patch is applied
once per process by the plugin, only on the vLLM versions it was checked against, and only
affects drafters that opt in with a ``bind_batch`` method.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

logger = logging.getLogger("cascade.predict.hook")
_MARK = "_cascade_bind_batch_hook"


def install_bind_batch_hook() -> bool:
    """Patch ``GPUModelRunner.propose_draft_token_ids`` (CPU runner inherits it). Idempotent."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner.propose_draft_token_ids
    if getattr(original, _MARK, False):
        return False

    @functools.wraps(original)
    def propose_draft_token_ids(self: Any, *args: Any, **kwargs: Any) -> Any:
        bind = getattr(getattr(self, "drafter", None), "bind_batch", None)
        if bind is not None:
            bind(list(self.input_batch.req_ids), self.requests)
        return original(self, *args, **kwargs)

    setattr(propose_draft_token_ids, _MARK, True)
    GPUModelRunner.propose_draft_token_ids = propose_draft_token_ids
    logger.debug("installed the static-text proposer's bind_batch hook")
    return True
