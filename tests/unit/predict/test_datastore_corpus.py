"""The service's code datastore: which sources, built once per tokenizer and corpus, loaded from the cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cascade.predict import datastore_corpus
from cascade.predict.datastore_corpus import datastore_for, python_sources

from tests.unit.predict.toy_tokens import ToyTokenizer

REPO = Path(__file__).resolve().parents[3]


def test_sources_fit_the_budget_leave_out_tests_and_the_service_and_repeat() -> None:
    chosen = python_sources(1 << 20)
    assert chosen == python_sources.__wrapped__(1 << 20)  # the same files when walked again
    assert 0 < sum((root / relative).stat().st_size for root, relative, _ in chosen) <= 1 << 20
    assert all((root / relative).stat().st_size == size for root, relative, size in chosen)
    assert not any({"test", "tests"} & set(relative.parts[:-1]) for _, relative, _ in chosen)
    service = (REPO / "service" / "cascade").resolve()
    assert not any(service in (root / relative).resolve().parents for root, relative, _ in chosen)


def test_no_datastore_when_off_or_for_a_vocabulary_that_is_not_a_tokenizers(tmp_path: Path) -> None:
    assert datastore_for(ToyTokenizer(), 32, tmp_path) is None
    assert not list(tmp_path.iterdir())


def vocabulary() -> Any:
    """pycoder's vocabulary as the engine builds it: a new object each time, as each engine process has its own."""
    transformers = pytest.importorskip("transformers")
    from cascade.vllm_compat.proposer import tokenizer_vocabulary

    return tokenizer_vocabulary(transformers.AutoTokenizer.from_pretrained(str(REPO / "models" / "pycoder-23m")))


def test_a_tokenizers_datastore_is_built_once_and_then_loaded_from_the_cache(tmp_path: Path) -> None:
    assert datastore_for(vocabulary(), 0, tmp_path) is None
    built = datastore_for(vocabulary(), 1, tmp_path)
    assert built is not None and built.ngrams > 1000
    stores = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(stores) == 1 and stores[0].name.startswith("datastore-")
    assert datastore_for(vocabulary(), 1, tmp_path) is built  # once per process
    datastore_corpus._loaded.clear()  # another process: from the folder the first one saved
    again = datastore_for(vocabulary(), 1, tmp_path)
    assert again is not None and again is not built and again.ngrams == built.ngrams
    assert [p for p in tmp_path.iterdir() if p.is_dir()] == stores
    vocab = vocabulary()
    context = vocab.encode(b"import os\n\n\nclass Settings:\n    def __init__(self")
    assert again.propose(context, 4, 0.0) == built.propose(context, 4, 0.0) != []


def test_a_cache_directory_that_cannot_be_written_still_gives_a_datastore(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    store = datastore_for(vocabulary(), 1, blocked / "datastores")
    assert store is not None and store.ngrams > 1000
