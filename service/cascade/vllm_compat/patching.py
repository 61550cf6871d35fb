"""Wrapping one method of vLLM's model runner class, idempotently and checkably (both hooks use it)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("cascade.vllm_compat.patching")
Method = Callable[..., Any]


def install_wrapper(runner_cls: type | None, method: str, mark: str, wrap: Callable[[Method], Method]) -> bool:
    """Replace ``runner_cls.<method>`` by ``wrap(original)`` (default class ``GPUModelRunner``, which
    the CPU runner inherits). Returns False when it was already wrapped."""
    if runner_cls is None:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        runner_cls = GPUModelRunner
    original = getattr(runner_cls, method)
    if getattr(original, mark, False):
        return False
    wrapped = wrap(original)
    setattr(wrapped, mark, True)
    setattr(runner_cls, method, wrapped)
    logger.debug("wrapped %s.%s", runner_cls.__name__, method)
    return True


def is_wrapped(runner_cls: type, method: str, mark: str) -> bool:
    """Whether ``runner_cls`` resolves ``method`` to a wrapper installed with ``mark``."""
    return bool(getattr(getattr(runner_cls, method, None), mark, False))
