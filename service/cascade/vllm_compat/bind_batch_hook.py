"""The one piece of vLLM internals the static-text proposer needs: which request sits in each row.

vLLM 0.32's ``custom_class`` proposer API passes rows but no request ids. Before each
``propose_draft_token_ids`` call we hand the drafter the runner's current ``input_batch.req_ids``
and ``requests`` (which hold each request's ``SamplingParams.extra_args``). Only drafters that opt
in with a ``bind_batch`` method are affected; ``proposer.StaticTextProposer`` refuses to propose
for a step it was not bound to, so a vLLM that stops calling this method fails loudly.

Installed by ``worker_extension.CascadeWorkerExtension.cascade_install_hooks`` (an RPC the gateway
sends to the engines that run the proposer), on the live runner's class.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

logger = logging.getLogger("cascade.vllm_compat.bind_batch_hook")
METHOD = "propose_draft_token_ids"
_MARK = "_cascade_bind_batch_hook"


def install_bind_batch_hook(runner_cls: type | None = None) -> bool:
    """Wrap ``runner_cls.propose_draft_token_ids`` (default ``GPUModelRunner``, which the CPU runner
    inherits). Returns False when it was already wrapped (idempotent)."""
    if runner_cls is None:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        runner_cls = GPUModelRunner
    original = getattr(runner_cls, METHOD)
    if getattr(original, _MARK, False):
        return False

    @functools.wraps(original)
    def propose_draft_token_ids(self: Any, *args: Any, **kwargs: Any) -> Any:
        bind = getattr(getattr(self, "drafter", None), "bind_batch", None)
        if bind is not None:
            bind(list(self.input_batch.req_ids), self.requests)
        return original(self, *args, **kwargs)

    setattr(propose_draft_token_ids, _MARK, True)
    setattr(runner_cls, METHOD, propose_draft_token_ids)
    logger.debug("installed the static-text proposer's bind_batch hook on %s", runner_cls.__name__)
    return True


def is_installed(runner_cls: type) -> bool:
    """Whether ``runner_cls`` resolves ``propose_draft_token_ids`` to the bind_batch hook."""
    return bool(getattr(getattr(runner_cls, METHOD, None), _MARK, False))
