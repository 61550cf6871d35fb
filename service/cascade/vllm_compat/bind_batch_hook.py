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
from typing import Any

from cascade.vllm_compat.patching import Method, install_wrapper, is_wrapped

METHOD = "propose_draft_token_ids"
_MARK = "_cascade_bind_batch_hook"


def install_bind_batch_hook(runner_cls: type | None = None) -> bool:
    """Wrap ``runner_cls.propose_draft_token_ids`` (default ``GPUModelRunner``). Returns False when it
    was already wrapped (idempotent)."""
    return install_wrapper(runner_cls, METHOD, _MARK, _bind_then_propose)


def _bind_then_propose(original: Method) -> Method:
    @functools.wraps(original)
    def propose_draft_token_ids(self: Any, *args: Any, **kwargs: Any) -> Any:
        bind = getattr(getattr(self, "drafter", None), "bind_batch", None)
        if bind is not None:
            bind(list(self.input_batch.req_ids), self.requests)
        return original(self, *args, **kwargs)

    return propose_draft_token_ids


def is_installed(runner_cls: type) -> bool:
    """Whether ``runner_cls`` resolves ``propose_draft_token_ids`` to the bind_batch hook."""
    return is_wrapped(runner_cls, METHOD, _MARK)
