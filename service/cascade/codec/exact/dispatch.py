"""How the project's compiled kernels are launched and reported to the op audit.

The compiled kernels (``fused``, ``frequencies``) run outside torch's dispatcher,
so the op audit (``audit.OpAudit``) cannot see them: each one ``report``s its name and operands to the
``observers`` before it runs, and ``launch`` runs it on the caller's torch thread count under one lock.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

try:
    import numba
except ImportError:  # pragma: no cover - numba is a pinned dependency; without it no kernel is launched
    numba = None

_LOCK = threading.Lock()
observers: list[Callable[[str, tuple[torch.Tensor, ...]], None]] = []
"""Called with each kernel's name and operands (``audit.OpAudit`` checks them: dispatch never sees numba)."""
_host = threading.local()


def report(name: str, *tensors: torch.Tensor) -> None:
    """Tell the ``observers`` that kernel ``name`` runs on ``tensors``."""
    for observe in observers:
        observe(name, tensors)


@contextlib.contextmanager
def host_step(name: str, *tensors: torch.Tensor) -> Iterator[None]:
    """A reviewed step of the decision path that runs on the host by design (``root.machine_root``'s
    square roots off the CPU, in a second reading of an earlier release's segment): reported as
    kernel ``name``; inside it (``on_host``) the audit does not hold tensors to the decision path's
    device."""
    report(name, *tensors)
    _host.depth = getattr(_host, "depth", 0) + 1
    try:
        yield
    finally:
        _host.depth -= 1


def on_host() -> bool:
    return getattr(_host, "depth", 0) > 0


def launch(kernel: Any, *args: Any) -> Any:
    """Run the numba ``kernel`` on as many threads as torch uses in this thread, and return its result.
    Numba's OpenMP start-up resets the calling thread's OpenMP thread count (measured: torch 1 → 2
    after the first launch), which would undo ``codec_threads`` and the single-threaded loading: the
    caller's count is put back. Numba's own count is set only when it changes. Calls are serialised:
    numba's default thread pool does not take concurrent launches."""
    threads = torch.get_num_threads()
    wanted = max(1, min(threads, numba.config.NUMBA_NUM_THREADS))
    with _LOCK:
        if getattr(_host, "numba_threads", None) != wanted:  # numba's count is per thread, and only set here
            numba.set_num_threads(wanted)
            _host.numba_threads = wanted
        result = kernel(*args)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return result
