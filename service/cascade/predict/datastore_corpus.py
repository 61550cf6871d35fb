"""The code datastore the service drafts from: this Python environment's own sources, tokenised once.

Every machine that runs the service has the same corpus at hand, with nothing to download: the
standard library and the installed packages' ``.py`` files (the pinned dependencies: the same files
on every install of a release, but for transitive packages that move with the index). Tests and the
service's own package are left out (so a replay of this project's history never drafts its own
after-files). Files are taken in the order of a hash of their path inside their root until the byte
budget is spent, which samples every package instead of the alphabet's first ones.

Tokenising ~32 MiB and counting takes ~30 s, so a datastore is built once per tokenizer (its token
bytes and how it spells a sample) and corpus, saved under ``$CASCADE_HOME/datastores`` (or the
configured directory) and memory-mapped from there; a lock lets one engine build while the others
wait for it.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import shutil
import sysconfig
import time
from collections.abc import Sequence
from pathlib import Path

from cascade.home import cascade_home
from cascade.predict.code_datastore import CodeDatastore
from cascade.predict.vocabulary import TokenizerVocabulary, Vocabulary

DEFAULT_MIB = 32
MAX_N = 4
FORMAT = 1
SAMPLE = "def f(self, x):\n    return {'k': [x ** 2]}  # ok → é\n"
logger = logging.getLogger("cascade.predict.datastore")


def default_cache_dir() -> Path:
    return cascade_home() / "datastores"


def _skipped(folder: str) -> bool:
    return folder in ("test", "tests", "site-packages", "__pycache__")


@functools.lru_cache(maxsize=8)
def python_sources(budget_bytes: int) -> tuple[tuple[Path, Path, int], ...]:
    """(root, path inside it, size) of the environment's ``.py`` files chosen for a corpus of
    ``budget_bytes`` (unreadable folders are skipped; symbolic links to folders are not followed).
    Walked once per process: the files are the installed packages'."""
    own = Path(__file__).resolve().parents[1]
    paths = sysconfig.get_paths()
    roots = list(dict.fromkeys(Path(paths[name]).resolve() for name in ("stdlib", "purelib", "platlib")))
    found: list[tuple[str, Path, Path, int]] = []
    for root in roots:
        for folder, subfolders, files in os.walk(root):
            here = Path(folder)
            subfolders[:] = sorted(d for d in subfolders if not _skipped(d) and here / d != own)
            for name in files:
                if not name.endswith(".py"):
                    continue
                relative = (here / name).relative_to(root)
                with contextlib.suppress(OSError):
                    size = (here / name).stat().st_size
                    found.append((hashlib.sha1(relative.as_posix().encode()).hexdigest(), root, relative, size))
    chosen: list[tuple[Path, Path, int]] = []
    spent = 0
    for _, root, relative, size in sorted(found):
        if spent + size <= budget_bytes:
            chosen.append((root, relative, size))
            spent += size
    return tuple(chosen)


def _fingerprint(vocab: TokenizerVocabulary, sources: Sequence[tuple[Path, Path, int]]) -> str:
    digest = hashlib.sha256(f"{FORMAT} {MAX_N}\n".encode())
    for piece in vocab.pieces:
        digest.update(len(piece).to_bytes(2, "little") + piece)
    digest.update(repr(vocab.encode(SAMPLE.encode())).encode())
    for _, relative, size in sources:
        digest.update(f"{relative.as_posix()} {size}\n".encode())
    return digest.hexdigest()[:24]


def build(vocab: Vocabulary, sources: Sequence[tuple[Path, Path, int]]) -> CodeDatastore:
    sequences = []
    for root, relative, _ in sources:
        try:
            data = (root / relative).read_bytes()
            data.decode("utf-8")  # only text files
        except (OSError, UnicodeDecodeError):
            continue
        sequences.append(vocab.encode(data))
    return CodeDatastore.build(sequences, MAX_N)


_loaded: dict[Path, CodeDatastore] = {}  # per process: each folder memory-mapped once


def datastore_for(vocab: Vocabulary, mib: int = DEFAULT_MIB, cache_dir: Path | None = None) -> CodeDatastore | None:
    """The datastore of ``mib`` MiB of this environment's sources for a tokenizer's vocabulary, from the
    cache or built into it; None when ``mib`` is 0 or the vocabulary is not a tokenizer's (only a
    ``TokenizerVocabulary`` says which tokenizer it is: what the service always uses). Loaded once per
    process and folder."""
    if mib <= 0 or not isinstance(vocab, TokenizerVocabulary):
        return None
    sources = python_sources(mib << 20)
    directory = (cache_dir or default_cache_dir()) / f"datastore-{_fingerprint(vocab, sources)}"
    if directory not in _loaded:
        _loaded[directory] = _load_or_build(directory, vocab, sources)
    return _loaded[directory]


def _load_or_build(directory: Path, vocab: Vocabulary, sources: Sequence[tuple[Path, Path, int]]) -> CodeDatastore:
    if directory.is_dir():
        return CodeDatastore.load(directory)
    cache_dir = directory.parent
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        lock = open(cache_dir / f"{directory.name}.lock", "w")  # noqa: SIM115 - held while building
    except OSError:
        logger.warning("code datastore cache not writable: building it in memory", extra={"path": str(cache_dir)})
        return _build(vocab, sources)
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if directory.is_dir():  # another engine built it while this one waited
            return CodeDatastore.load(directory)
        datastore = _build(vocab, sources)
        partial = cache_dir / f"{directory.name}.{os.getpid()}.partial"
        try:
            shutil.rmtree(partial, ignore_errors=True)
            datastore.save(partial)
            partial.rename(directory)
        except OSError:
            logger.warning("code datastore not saved", extra={"path": str(directory)}, exc_info=True)
            shutil.rmtree(partial, ignore_errors=True)
            return datastore
    return CodeDatastore.load(directory)


def _build(vocab: Vocabulary, sources: Sequence[tuple[Path, Path, int]]) -> CodeDatastore:
    began = time.perf_counter()
    datastore = build(vocab, sources)
    logger.info("code datastore built", extra={"files": len(sources), "ngrams": datastore.ngrams,
                                               "seconds": round(time.perf_counter() - began, 1)})
    return datastore
