"""Cascade's vLLM general plugin: runs in every vLLM process (API, engine core, workers).

It checks that the installed vLLM is exactly the release Cascade's in-engine code was checked against
(``cascade.vllm_compat.version``), and makes the process's exit quick (``_exit_quickly``). Nothing is
patched here: the gateway installs the hooks each engine role needs by RPC once that engine has
started (``cascade.vllm_compat.worker_extension``), and passes the proposer class to the engine that
needs it explicitly.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import sys

from cascade.vllm_compat.version import check_vllm_version

logger = logging.getLogger("cascade.plugin")
_exit_registered = False


def _exit_quickly() -> None:
    """Skip the interpreter's last full garbage collection. Over the millions of objects torch and vLLM
    import it took seconds in every engine process, so vLLM's 5 s shutdown grace ran out and each engine
    was killed instead of exiting (a SIGTERM took the gateway 12.7 s with two engines, 3.6 s without the
    scan); the operating system reclaims the memory anyway. What the collection would have freed is
    then reported by extension modules that count their objects at exit (triton's bindings print a
    page of "leaked" lines per process), so stderr goes to /dev/null for the rest of the exit. An
    uncaught exception has been printed before exit handlers run; the exit handlers registered before
    the plugin loaded (logging's flush, multiprocessing's) run after this one, and printed nothing at a
    normal stop before this handler existed."""
    sys.stderr.flush()
    gc.freeze()
    with open(os.devnull, "wb") as devnull:
        os.dup2(devnull.fileno(), 2)


def register() -> None:
    """Entry point ``vllm.general_plugins: cascade``; safe to call many times."""
    global _exit_registered
    version = check_vllm_version()
    if not _exit_registered:
        atexit.register(_exit_quickly)
        _exit_registered = True
    logger.debug("cascade plugin loaded on vLLM %s", version)
