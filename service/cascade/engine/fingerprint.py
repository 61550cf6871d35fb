"""Model fingerprint: identifies weights + tokenizer, so a codec container names the model it needs."""

from __future__ import annotations

import hashlib
from pathlib import Path

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                    "merges.txt", "tokenizer.model")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def model_fingerprint(model: str) -> bytes:
    """SHA-256 over the weight and tokenizer files of a local model directory.

    For a hub id (not a directory) the name itself is hashed: the fingerprint then only protects
    against using a differently named model, which the docs state.
    """
    path = Path(model)
    digest = hashlib.sha256()
    if not path.is_dir():
        digest.update(b"name:" + model.encode())
        return digest.digest()
    files = sorted(p for p in path.iterdir() if p.name in _TOKENIZER_FILES or p.suffix in _WEIGHT_SUFFIXES)
    for file in files:
        digest.update(file.name.encode() + b"\0")
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.digest()
