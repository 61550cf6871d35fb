"""The two pieces of vLLM internals the static-text proposer needs, on the model runner's class.

- **Which request sits in each row.** vLLM 0.32's ``custom_class`` proposer API passes rows but no
  request ids. Before each ``propose_draft_token_ids`` call we hand the drafter the runner's current
  ``input_batch.req_ids`` and ``requests`` (which hold each request's ``SamplingParams.extra_args``).
  ``proposer.StaticTextProposer`` refuses to propose for a step it was not bound to, so a vLLM that
  stops calling this method fails loudly.
- **Drafting near the end of the context.** ``_input_fits_in_drafter`` skips the drafter for the whole
  batch once its longest sequence (with its scheduled drafts) plus K passes ``max_model_len`` — a limit
  for drafters that run a model of their own — and then schedules K drafts of token 0 for *every* row:
  each is rejected, each step verifies K useless positions (a request within K tokens of the context
  end ran ~5× slower with a prediction than without, and made every request batched with it pay the
  same), and vLLM counts them as rejected prediction tokens. A text drafter runs no model and caps
  each row's draft at the context itself, so for it the input always fits.

Only drafters that opt in with a ``bind_batch`` method are affected.

Installed by ``worker_extension.CascadeWorkerExtension.cascade_install_hooks`` (an RPC the gateway
sends to the engines that run the proposer), on the live runner's class.
"""

from __future__ import annotations

import functools
from typing import Any

from cascade.vllm_compat.patching import Method, install_wrapper, is_wrapped

METHOD = "propose_draft_token_ids"
FITS = "_input_fits_in_drafter"
_MARK = "_cascade_bind_batch_hook"


def install_bind_batch_hook(runner_cls: type | None = None) -> bool:
    """Wrap ``runner_cls.propose_draft_token_ids`` and ``_input_fits_in_drafter`` (default
    ``GPUModelRunner``). Returns False when both were already wrapped (idempotent)."""
    bound = install_wrapper(runner_cls, METHOD, _MARK, _bind_then_propose)
    fits = install_wrapper(runner_cls, FITS, _MARK, _fits_for_text_drafters)
    return bound or fits


def _bind_then_propose(original: Method) -> Method:
    @functools.wraps(original)
    def propose_draft_token_ids(self: Any, *args: Any, **kwargs: Any) -> Any:
        bind = getattr(getattr(self, "drafter", None), "bind_batch", None)
        if bind is not None:
            bind(list(self.input_batch.req_ids), self.requests)
        return original(self, *args, **kwargs)

    return propose_draft_token_ids


def _fits_for_text_drafters(original: Method) -> Method:
    @functools.wraps(original)
    def _input_fits_in_drafter(self: Any, common_attn_metadata: Any) -> Any:
        if common_attn_metadata is not None and hasattr(getattr(self, "drafter", None), "bind_batch"):
            return True
        return original(self, common_attn_metadata)

    return _input_fits_in_drafter


def is_installed(runner_cls: type) -> bool:
    """Whether ``runner_cls`` resolves both methods to the bind_batch hook's wrappers."""
    return is_wrapped(runner_cls, METHOD, _MARK) and is_wrapped(runner_cls, FITS, _MARK)
