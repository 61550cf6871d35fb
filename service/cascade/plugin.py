"""Cascade's vLLM general plugin: runs in every vLLM process (API, engine core, workers).

It checks that the installed vLLM is the one Cascade's extensions were written against, then
installs the two internal hooks Cascade needs: the static-text proposer learning which request
sits in each batch row, and export requests' prompt logits passing through the sampling stack.
The extensions themselves (logits processors, the proposer class) are passed to each engine
explicitly, so each engine role gets exactly the ones it needs.
"""

from __future__ import annotations

import logging

SUPPORTED_VLLM = ("0.32.",)
logger = logging.getLogger("cascade.plugin")


class UnsupportedVllmError(RuntimeError):
    """The installed vLLM is not a version whose internals Cascade's hooks were checked against."""


def check_vllm_version(version: str | None = None) -> str:
    """Return the vLLM version, or raise when Cascade's hooks were not checked against it."""
    if version is None:
        import vllm

        version = str(vllm.__version__)
    if not version.startswith(SUPPORTED_VLLM):
        raise UnsupportedVllmError(
            f"Cascade supports vLLM {', '.join(v + 'x' for v in SUPPORTED_VLLM)}; found {version}"
        )
    return version


def register() -> None:
    """Entry point ``vllm.general_plugins: cascade``; safe to call many times."""
    version = check_vllm_version()
    from cascade.export.vllm_hook import install_export_hook
    from cascade.predict.vllm_hook import install_bind_batch_hook

    install_bind_batch_hook()
    install_export_hook()
    logger.debug("cascade plugin loaded on vLLM %s", version)
