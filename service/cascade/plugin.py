"""Cascade's vLLM general plugin: runs in every vLLM process (API, engine core, workers).

It only checks that the installed vLLM is exactly the release Cascade's in-engine code was checked
against (``cascade.vllm_compat.version``). Nothing is patched here: the gateway installs the hooks
each engine role needs by RPC once that engine has started (``cascade.vllm_compat.worker_extension``),
and passes the proposer class to the engine that needs it explicitly.
"""

from __future__ import annotations

import logging

from cascade.vllm_compat.version import check_vllm_version

logger = logging.getLogger("cascade.plugin")


def register() -> None:
    """Entry point ``vllm.general_plugins: cascade``; safe to call many times."""
    version = check_vllm_version()
    logger.debug("cascade plugin loaded on vLLM %s", version)
