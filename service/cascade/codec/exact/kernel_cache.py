"""The compiled exact kernels kept on disk between processes (numba's cache), with the inspection verdict
that makes cached machine code as trustworthy as freshly compiled code.

Why: numba compiled the fused kernels again in every process that loaded an exact model, 50–58 s on
a 2-core AVX2 host with their inspection, paid by every service start, every replica and every test
process that starts one. With this cache a process after the first loads them in under a second
(``benchmarks/bench_kernel_cache.py``).

Why it cannot change a bit or admit a contracted kernel:

- numba keys its cache by function, signature and the host CPU (name and features), and by the stamp of
  the function's own source file; it does not see the constants a kernel takes from another module
  (``grid``), nor the options a function was compiled with (``parallel``). So the cache lives in a
  directory named by a digest of *every* source file of this package, numba's and llvmlite's versions
  and the host CPU's name and features: code compiled from other sources, by another compiler or for
  another CPU is never looked up. Variants of one function compiled with other options are cached
  under their own names (``fused._RowKernel``).
- machine code loaded from the cache cannot be inspected (numba keeps no assembly for it), and the
  fused kernels are refused where the compiler contracted an operation into a fused multiply-add.
  So the process that compiles a kernel inspects it and writes the verdict beside the code
  (``verdicts.json``); a process that loads a kernel uses that verdict, and a kernel loaded without one
  is compiled again here and inspected (``inspected``).
- where the directory cannot be written, nothing is cached and every process compiles, as before; an
  entry that cannot be read is compiled again and written over.

Where: ``$NUMBA_CACHE_DIR/cascade`` when numba's documented variable is set (the image sets it to its
state volume, so a restarted container starts at once), else ``$XDG_CACHE_HOME/cascade/kernels``
(``~/.cache``). Stale directories of other versions are left for the operator to delete: each is a
few MB.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger("cascade.codec")
_PACKAGE = Path(__file__).resolve().parent
_VERDICTS = "verdicts.json"


def root() -> Path:
    """The parent of every version's directory (see the module's docstring)."""
    numba_dir = os.environ.get("NUMBA_CACHE_DIR")
    if numba_dir:
        return Path(numba_dir) / "cascade"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cascade" / "kernels"


def identity(host: tuple[str, ...]) -> str:
    """A digest of this package's sources and ``host`` (compiler versions, CPU name and features)."""
    digest = hashlib.sha256(json.dumps(host).encode())
    for source in sorted(_PACKAGE.glob("*.py")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
    return digest.hexdigest()[:20]


def _host() -> tuple[str, ...]:
    import llvmlite
    import llvmlite.binding as llvm
    import numba

    return (sys.version, numba.__version__, llvmlite.__version__, llvm.get_process_triple(),
            numba.config.CPU_NAME or llvm.get_host_cpu_name(),
            numba.config.CPU_FEATURES or llvm.get_host_cpu_features().flatten())


def writable(directory: Path) -> bool:
    """Whether ``directory`` exists or can be made, and takes a file."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=directory).close()
    except OSError:
        return False
    return True


@functools.cache
def directory() -> Path | None:
    """This version's cache directory on this host, or None where nothing can be cached."""
    try:
        path = root() / identity(_host())
    except (ImportError, RuntimeError, OSError):
        return None
    if not writable(path):
        logger.warning("exact kernels are compiled in every process: %s cannot be written", path)
        return None
    return path


def njit(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``numba.njit(**options)``, cached in ``directory()`` where it can be written (``_TolerantCache``)."""
    import numba

    def decorate(function: Callable[..., Any]) -> Any:
        kernel = numba.njit(cache=False, **options)(function)
        path = directory()
        if path is not None:
            try:
                with _pointed_at(path):
                    kernel._cache = _tolerant_cache()(function)  # what numba's ``enable_caching`` sets
            except Exception as exc:  # another numba's caching internals (the GPU flavour's numba is vLLM's)
                logger.warning("exact kernel %s is compiled in every process (%s: %s)", function.__name__,
                               type(exc).__name__, exc)
        return kernel

    return decorate


@functools.cache
def _tolerant_cache() -> type:
    from numba.core.caching import FunctionCache

    class TolerantCache(FunctionCache):
        """numba's on-disk cache of a function, where an entry that cannot be read (a damaged or
        truncated file) is a miss: compiled again and written over. numba raises instead, and a
        kernel that fails to load would leave the codec on torch's slower operations for good, or
        fail a request whose kernel compiles on first use (``frequencies``)."""

        def load_overload(self, sig: Any, target_context: Any) -> Any:
            try:
                return super().load_overload(sig, target_context)
            except Exception as exc:  # unpickling a damaged file raises many types
                logger.warning("a cached exact kernel could not be read (%s: %s): compiled again",
                               type(exc).__name__, exc)
                return None

    return TolerantCache


@contextlib.contextmanager
def _pointed_at(path: Path) -> Iterator[None]:
    """numba's cache directory set to ``path`` while a kernel is decorated: the dispatcher takes its
    directory then (numba's ``UserProvidedCacheLocator``), so numba's setting for other code is unchanged."""
    import numba

    before = numba.config.CACHE_DIR
    numba.config.CACHE_DIR = str(path)
    try:
        yield
    finally:
        numba.config.CACHE_DIR = before


def _key(kernel: Any, signature: Any, pattern: re.Pattern[str]) -> str:
    """A verdict's key: the kernel, its signature and the inspection (a verdict answers only its own)."""
    return f"{kernel.py_func.__module__}.{kernel.py_func.__qualname__}{signature} /{pattern.pattern}/"


def read_verdicts(path: Path | None) -> dict[str, list[str]]:
    """The verdicts recorded in ``path``; a file that cannot be read, or an entry that is not a list of
    findings, counts as no verdict (its kernel is compiled again and inspected)."""
    try:
        data = json.loads((path / _VERDICTS).read_text()) if path is not None else {}
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {key: found for key, found in data.items()
            if isinstance(found, list) and all(isinstance(f, str) for f in found)}


def _write_verdicts(path: Path, new: dict[str, list[str]]) -> None:
    """Merge ``new`` into the directory's verdicts (a concurrent writer can only lose an entry, whose kernel
    is then compiled again)."""
    merged = read_verdicts(path) | new
    with tempfile.NamedTemporaryFile("w", dir=path, delete=False, suffix=".tmp") as out:
        json.dump(merged, out, sort_keys=True, indent=0)
    os.replace(out.name, path / _VERDICTS)


def inspected(kernels: Iterable[Any], pattern: re.Pattern[str]) -> list[str]:
    """``pattern``'s matches in the machine code of every compiled signature of ``kernels`` (numba
    dispatchers), as ``"<kernel><signature>: <match>"``. A signature compiled in this process is inspected
    and its verdict recorded; one loaded from the cache takes its recorded verdict, and a kernel loaded
    without one is compiled again (``recompile``: numba drops its cache entry) and inspected."""
    path = directory()
    verdicts = read_verdicts(path)
    found: list[str] = []
    new: dict[str, list[str]] = {}
    for kernel in kernels:
        loaded = set(kernel.stats.cache_hits)
        if any(_key(kernel, signature, pattern) not in verdicts for signature in loaded):
            kernel.recompile()
            loaded = set()
        for signature in kernel.signatures:
            key = _key(kernel, signature, pattern)
            if signature in loaded:
                found += verdicts[key]
                continue
            matches = [f"{kernel.__name__}{signature}: {m.group(0)}"
                       for m in pattern.finditer(kernel.inspect_asm(signature))]
            found += matches
            if kernel.stats.cache_path is not None:
                new[key] = matches
    if new and path is not None:
        with contextlib.suppress(OSError):
            _write_verdicts(path, new)
    return found

