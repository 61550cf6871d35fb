"""The one vLLM release whose internals Cascade's in-engine code was checked against."""

from __future__ import annotations

PINNED_VLLM = "0.32.0"


class IncompatibleVllmError(RuntimeError):
    """The installed vLLM is not the pinned release, or differs from what Cascade relies on."""


def check_vllm_version(version: str | None = None) -> str:
    """Return the vLLM version (default: the installed one), or raise when it is not the pin.

    The comparison is exact on the release (``0.32.1``, ``0.32.0rc1`` and ``0.32`` are refused); a
    local build label such as ``0.32.0+cpu`` names the same source and is accepted."""
    if version is None:
        import vllm

        version = str(vllm.__version__)
    if version.split("+", 1)[0] != PINNED_VLLM:
        raise IncompatibleVllmError(
            f"Cascade's vLLM extensions were checked against vLLM {PINNED_VLLM} exactly; found vLLM {version}"
        )
    return version
