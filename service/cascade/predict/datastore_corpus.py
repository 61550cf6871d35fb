"""The code datastore the service drafts from: this Python environment's own sources, tokenised once.

Every machine that runs the service has the same corpus at hand, with nothing to download: the
standard library and the installed packages' ``.py`` files (the pinned dependencies, so the same
files on every install of a release). Tests and the service's own package are left out (so a replay
of this project's history never drafts its own after-files). Files are taken in the order of a hash
of their path inside their root until the byte budget is spent, which samples every package instead
of the alphabet's first ones.

Tokenising ~32 MiB and counting takes ~30 s, so a datastore is built once per tokenizer (its token
bytes and how it spells a sample) and corpus, saved under ``$CASCADE_HOME/datastores`` (or the
configured directory) and memory-mapped from there; a lock lets one engine build while the others
wait for it.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
import shutil
import sysconfig
import time
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


def _skipped(relative: Path) -> bool:
    return any(part in ("test", "tests", "site-packages", "__pycache__") for part in relative.parts[:-1])


def python_sources(budget_bytes: int) -> list[tuple[Path, Path]]:
    """(root, path inside it) of the environment's ``.py`` files chosen for a corpus of ``budget_bytes``."""
    own = Path(__file__).resolve().parents[1]
    paths = sysconfig.get_paths()
    roots = list(dict.fromkeys(Path(paths[name]).resolve() for name in ("stdlib", "purelib", "platlib")))
    found: list[tuple[str, Path, Path]] = []
    for root in roots:
        for path in root.rglob("*.py"):
            relative = path.relative_to(root)
            if _skipped(relative) or own in path.resolve().parents:
                continue
            found.append((hashlib.sha1(relative.as_posix().encode()).hexdigest(), root, relative))
    chosen: list[tuple[Path, Path]] = []
    spent = 0
    for _, root, relative in sorted(found):
        size = (root / relative).stat().st_size
        if spent + size > budget_bytes:
            continue
        chosen.append((root, relative))
        spent += size
    return chosen


def _fingerprint(vocab: TokenizerVocabulary, sources: list[tuple[Path, Path]]) -> str:
    digest = hashlib.sha256(f"{FORMAT} {MAX_N}\n".encode())
    for piece in vocab.pieces:
        digest.update(len(piece).to_bytes(2, "little") + piece)
    digest.update(repr(vocab.encode(SAMPLE.encode())).encode())
    for root, relative in sources:
        digest.update(f"{relative.as_posix()} {(root / relative).stat().st_size}\n".encode())
    return digest.hexdigest()[:24]


def build(vocab: Vocabulary, sources: list[tuple[Path, Path]]) -> CodeDatastore:
    sequences = []
    for root, relative in sources:
        try:
            text = (root / relative).read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        sequences.append(vocab.encode(text.encode()))
    return CodeDatastore.build(sequences, MAX_N)


def datastore_for(vocab: Vocabulary, mib: int = DEFAULT_MIB, cache_dir: Path | None = None) -> CodeDatastore | None:
    """The datastore of ``mib`` MiB of this environment's sources for a tokenizer's vocabulary, from the
    cache or built into it; None when ``mib`` is 0 or the vocabulary is not a tokenizer's (only a
    ``TokenizerVocabulary`` says which tokenizer it is: what the service always uses)."""
    if mib <= 0 or not isinstance(vocab, TokenizerVocabulary):
        return None
    return _cached(vocab, mib, cache_dir or default_cache_dir())


@functools.lru_cache(maxsize=4)
def _cached(vocab: TokenizerVocabulary, mib: int, cache_dir: Path) -> CodeDatastore:
    sources = python_sources(mib << 20)
    directory = cache_dir / f"datastore-{_fingerprint(vocab, sources)}"
    if not directory.is_dir():
        cache_dir.mkdir(parents=True, exist_ok=True)
        with open(cache_dir / f"{directory.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not directory.is_dir():
                began = time.perf_counter()
                datastore = build(vocab, sources)
                partial = cache_dir / f"{directory.name}.{os.getpid()}.partial"
                shutil.rmtree(partial, ignore_errors=True)
                datastore.save(partial)
                partial.rename(directory)
                logger.info("code datastore built", extra={"files": len(sources), "ngrams": datastore.ngrams,
                                                           "seconds": round(time.perf_counter() - began, 1),
                                                           "path": str(directory)})
    return CodeDatastore.load(directory)
