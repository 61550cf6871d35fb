"""Top-k export through the clients and ``cascade export-topk`` against the live service."""

from __future__ import annotations

import asyncio
import io
import itertools
from pathlib import Path

import numpy as np
import pytest
from cascade_client import AsyncCascadeClient, BadRequestError, CascadeClient, TopkDocument
from cascade_client.topk_document import read_all

from tests.integration.conftest import Service
from tests.integration.test_client import _cli, _one_error_line

CODE = "def mean(values):\n    total = 0\n    for v in values:\n        total += v\n    return total / len(values)\n"


def _tokens(service: Service, text: str) -> list[int]:
    with service.client() as http:
        reply = http.post("/v1/tokenize", json={"model": "pycoder-23m", "prompt": text})
    assert reply.status_code == 200, reply.text
    return list(reply.json()["tokens"])


def _corpus(root: Path) -> dict[str, str]:
    files = {"a.py": CODE * 6, "sub/b.py": "import os\n" + CODE * 2, "sub/c.txt": "x"}
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return files


def _by_file(documents: list[TopkDocument]) -> dict[str, TopkDocument]:
    """Each file's documents joined, after checking they are contiguous from token 1."""
    joined: dict[str, list[TopkDocument]] = {}
    for doc in documents:
        joined.setdefault(Path(doc.name).name, []).append(doc)
    out = {}
    for name, docs in joined.items():
        assert docs[0].start == 1
        for before, after in itertools.pairwise(docs):
            assert after.start == before.start + len(before)
        out[name] = TopkDocument(name, 1, np.concatenate([d.targets for d in docs]),
                                 np.concatenate([d.ids for d in docs]), np.concatenate([d.logprobs for d in docs]))
    return out


def test_client_export_topk_returns_every_position_as_arrays(service: Service) -> None:
    with CascadeClient(service.base_url, service.api_key) as client:
        doc = client.export_topk(CODE, compression_top_k=8, temperature=0.8)
    tokens = _tokens(service, CODE)
    assert doc.start == 1 and doc.targets.tolist() == tokens[1:]
    assert doc.ids.shape == (len(tokens) - 1, 8) and doc.logprobs.dtype == np.float32
    np.testing.assert_allclose(np.exp(doc.logprobs.astype(np.float64)).sum(axis=1), 1.0, atol=1e-5)


def test_async_client_export_topk_matches_sync(service: Service) -> None:
    async def run() -> TopkDocument:
        async with AsyncCascadeClient(service.base_url, service.api_key) as client:
            return await client.export_topk(CODE, compression_top_k=4)

    with CascadeClient(service.base_url, service.api_key) as client:
        expected = client.export_topk(CODE, compression_top_k=4)
    got = asyncio.run(run())
    assert got.targets.tolist() == expected.targets.tolist()
    np.testing.assert_allclose(got.logprobs, expected.logprobs, atol=1e-4)


def test_cli_exports_a_directory_in_windows_that_cover_every_position(service: Service, tmp_path: Path) -> None:
    files = _corpus(tmp_path / "corpus")
    out = tmp_path / "export.bin"
    result = _cli(service, "export-topk", str(tmp_path / "corpus"), "-o", str(out), "--compression-top-k", "5",
                  "--window", "64", "--overlap", "16", "--concurrency", "3", "--progress")
    assert result.returncode == 0, result.stderr
    assert b"positions" in result.stderr and b"upload" in result.stderr
    with out.open("rb") as handle:
        header, documents = read_all(handle)
    assert header.k == 5 and header.vocab_size > 0
    exported = _by_file(documents)
    assert set(exported) == {"a.py", "b.py"}  # c.txt is one token: nothing to predict
    for name, text in (("a.py", files["a.py"]), ("b.py", files["sub/b.py"])):
        assert exported[name].targets.tolist() == _tokens(service, text)[1:]
    assert max(len(d) for d in documents) <= 63


def test_cli_export_first_window_equals_a_direct_export(service: Service, tmp_path: Path) -> None:
    (tmp_path / "one.py").write_text(CODE)
    result = _cli(service, "-q", "export-topk", str(tmp_path / "one.py"), "-o", "-", "--compression-top-k", "6",
                  "--temperature", "0.7", "--top-p", "0.9")
    assert result.returncode == 0 and result.stderr == b""
    _, [document] = read_all(io.BytesIO(result.stdout))
    with CascadeClient(service.base_url, service.api_key) as client:
        direct = client.export_topk(CODE, compression_top_k=6, temperature=0.7, top_p=0.9)
    assert document.targets.tolist() == direct.targets.tolist()
    np.testing.assert_allclose(document.logprobs, direct.logprobs, atol=1e-4)


def test_async_export_to_a_sink_and_errors(service: Service, tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text(CODE * 3)

    async def run() -> bytes:
        sink = io.BytesIO()
        async with AsyncCascadeClient(service.base_url, service.api_key) as client:
            stats = await client.export_topk_to(sink, [tmp_path], compression_top_k=3, window=40, overlap=8)
            assert stats.files == 1 and stats.positions == stats.tokens - 1 and stats.output_bytes == len(
                sink.getvalue())
            with pytest.raises(BadRequestError, match="compression_top_k"):
                await client.export_topk(CODE, compression_top_k=0)
        return sink.getvalue()

    _, documents = read_all(io.BytesIO(asyncio.run(run())))
    assert _by_file(documents)["a.py"].targets.tolist() == _tokens(service, CODE * 3)[1:]


def test_sampling_top_k_is_its_own_name_in_client_and_cli(service: Service, tmp_path: Path) -> None:
    with CascadeClient(service.base_url, service.api_key) as client:
        doc = client.export_topk(CODE, 8, top_k=3)
    assert doc.ids.shape[1] == 8
    assert (np.isfinite(doc.logprobs).sum(axis=1) <= 3).all()
    (tmp_path / "one.py").write_text(CODE)
    result = _cli(service, "-q", "export-topk", str(tmp_path / "one.py"), "-o", "-", "--compression-top-k", "8",
                  "--top-k", "3")
    assert result.returncode == 0, result.stderr
    _, [document] = read_all(io.BytesIO(result.stdout))
    assert document.ids.tolist() == doc.ids.tolist()


def test_cli_export_of_a_file_over_64_kib_follows_the_whole_files_tokens(service: Service, tmp_path: Path) -> None:
    text = "".join(f"def f{i}(x):\n\n    if x:\n        return {i}\n\n\n" for i in range(2400))
    assert len(text.encode()) > 70_000
    (tmp_path / "big.py").write_text(text)
    out = tmp_path / "big.bin"
    result = _cli(service, "-q", "export-topk", str(tmp_path / "big.py"), "-o", str(out), "--compression-top-k", "1")
    assert result.returncode == 0, result.stderr
    with out.open("rb") as handle:
        _, documents = read_all(handle)
    assert _by_file(documents)["big.py"].targets.tolist() == _tokens(service, text)[1:]


def test_cli_export_errors_are_one_line(service: Service, tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text(CODE)
    assert "(HTTP 400)" in _one_error_line(_cli(service, "export-topk", str(tmp_path / "a.py"), "-o",
                                                str(tmp_path / "x.bin"), "--compression-top-k", "0"))
    assert not (tmp_path / "x.bin").exists()
    (tmp_path / "bin.dat").write_bytes(b"\xff\xfe\x00")
    assert "not UTF-8" in _one_error_line(_cli(service, "export-topk", str(tmp_path / "bin.dat"), "-o", "-"))
    assert "no such file" in _one_error_line(_cli(service, "export-topk", str(tmp_path / "nope"), "-o", "-"))
    assert "overlap" in _one_error_line(_cli(service, "export-topk", str(tmp_path / "a.py"), "-o", "-",
                                             "--window", "10", "--overlap", "20"))
