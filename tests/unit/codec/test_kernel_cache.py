"""The on-disk cache of compiled exact kernels: named by sources and host, and never trusted without the
verdict of the process that inspected the machine code."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cascade.codec.exact import fused, kernel_cache

numba = pytest.importorskip("numba")
RETURN = re.compile(r"\bret\w*\b")
"""An instruction every compiled function holds, on any instruction set: stands in for a fused multiply-add."""


def twice(x: Any, out: Any) -> None:  # pragma: no cover - compiled
    for i in range(x.shape[0]):
        out[i] = x[i] * 2.0


def halves(x: Any, out: Any) -> None:  # pragma: no cover - compiled
    for i in numba.prange(x.shape[0]):
        out[i] = x[i] / 2.0


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(kernel_cache, "directory", lambda: tmp_path)
    return tmp_path


def _compiled(function: Any, **options: Any) -> Any:
    kernel = kernel_cache.njit(**options)(function)
    kernel(np.arange(4.0), np.empty(4))
    return kernel


def test_the_directory_is_named_by_the_packages_sources_and_the_host() -> None:
    host = ("3.11", "numba 0.65", "llvmlite 0.47", "x86_64-unknown-linux-gnu", "znver3", "+avx2,+fma")
    assert kernel_cache.identity(host) == kernel_cache.identity(host)
    assert kernel_cache.identity(host) != kernel_cache.identity((*host[:4], "skylake-avx512", "+avx512f"))


def test_the_cache_lives_under_numbas_own_setting_else_the_users_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NUMBA_CACHE_DIR", "/srv/numba")
    assert kernel_cache.root() == Path("/srv/numba/cascade")
    monkeypatch.delenv("NUMBA_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "/home/u/.cache")
    assert kernel_cache.root() == Path("/home/u/.cache/cascade/kernels")


def test_a_directory_that_cannot_be_written_caches_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert not kernel_cache.writable(blocker / "kernels")
    monkeypatch.setattr(kernel_cache, "directory", lambda: None)
    kernel = _compiled(twice)
    assert kernel.stats.cache_path is None
    assert kernel_cache.inspected([kernel], RETURN)


def test_a_kernel_compiled_here_is_inspected_and_its_verdict_recorded(cache_dir: Path) -> None:
    kernel = _compiled(twice)
    found = kernel_cache.inspected([kernel], RETURN)
    assert found and all(f.startswith("twice(") for f in found)
    assert list(kernel_cache.read_verdicts(cache_dir).values()) == [found]


def test_a_kernel_loaded_from_the_cache_takes_the_verdict_of_the_process_that_compiled_it(cache_dir: Path) -> None:
    first = kernel_cache.inspected([_compiled(twice)], RETURN)
    loaded = _compiled(twice)
    assert sum(loaded.stats.cache_hits.values()) == 1
    assert kernel_cache.inspected([loaded], RETURN) == first
    assert sum(loaded.stats.cache_misses.values()) == 0


def test_a_kernel_loaded_without_a_verdict_is_compiled_again_and_inspected(cache_dir: Path) -> None:
    first = kernel_cache.inspected([_compiled(twice)], RETURN)
    (cache_dir / "verdicts.json").unlink()
    loaded = _compiled(twice)
    assert sum(loaded.stats.cache_hits.values()) == 1
    assert kernel_cache.inspected([loaded], RETURN) == first
    assert sum(loaded.stats.cache_misses.values()) == 1
    assert kernel_cache.read_verdicts(cache_dir)


def test_a_recorded_finding_refuses_the_loaded_kernel_and_answers_only_its_own_inspection(cache_dir: Path) -> None:
    first = kernel_cache.inspected([_compiled(twice)], RETURN)
    loaded = _compiled(twice)
    assert kernel_cache.inspected([loaded], RETURN) == first != []
    assert sum(loaded.stats.cache_misses.values()) == 0
    assert kernel_cache.inspected([loaded], re.compile("never matches")) == []
    assert sum(loaded.stats.cache_misses.values()) == 1


def test_a_row_kernels_serial_variant_is_cached_apart_from_its_parallel_one(cache_dir: Path) -> None:
    first = fused._RowKernel(halves)
    for rows in (1, 4):
        first(rows, np.arange(rows, dtype=np.float64), np.empty(rows))
    assert sorted(p.name.split("-")[0] for p in cache_dir.rglob("*.nbi")) == [
        "test_kernel_cache.halves", "test_kernel_cache.halves_serial"]
    again = fused._RowKernel(halves)
    x = np.arange(4.0)
    for variant in again.variants:
        out = np.empty(4)
        variant(x, out)
        assert np.array_equal(out, x / 2.0)
        assert sum(variant.stats.cache_hits.values()) == 1


def test_a_damaged_cache_entry_is_compiled_again_and_written_over(cache_dir: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    _compiled(twice)
    (entry,) = cache_dir.rglob("*twice*.nbc")
    entry.write_bytes(entry.read_bytes()[:40])
    damaged = _compiled(twice)
    assert "could not be read" in caplog.text
    assert sum(damaged.stats.cache_misses.values()) == 1
    out = np.empty(3)
    damaged(np.array([1.0, -2.0, 0.5]), out)
    assert out.tolist() == [2.0, -4.0, 1.0]
    assert sum(_compiled(twice).stats.cache_hits.values()) == 1


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '"text"', '{"k": 5}', '{"k": [1]}'])
def test_a_verdict_file_that_cannot_be_read_counts_as_no_verdict(cache_dir: Path, text: str) -> None:
    first = kernel_cache.inspected([_compiled(twice)], RETURN)
    (cache_dir / "verdicts.json").write_text(text)
    assert kernel_cache.read_verdicts(cache_dir) == {}
    loaded = _compiled(twice)
    assert kernel_cache.inspected([loaded], RETURN) == first
    assert sum(loaded.stats.cache_misses.values()) == 1


def test_a_numba_whose_cache_cannot_be_set_up_compiles_in_every_process(
        cache_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def missing() -> type:
        raise ImportError("numba.core.caching moved")

    monkeypatch.setattr(kernel_cache, "_tolerant_cache", missing)
    kernel = _compiled(twice)
    assert kernel.stats.cache_path is None
    assert "compiled in every process" in caplog.text
    assert kernel_cache.inspected([kernel], RETURN)
