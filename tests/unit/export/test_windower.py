"""Corpus windowing for ``cascade export-topk``: every token after the first is exported exactly once,
each window fits the model and carries the requested context."""

from __future__ import annotations

from cascade_client.topk_export import Windower, read_pieces
from hypothesis import given
from hypothesis import strategies as st


@given(st.lists(st.lists(st.integers(0, 99), max_size=40), max_size=12), st.integers(3, 30), st.data())
def test_every_position_is_exported_once_with_context(pieces: list[list[int]], window: int,
                                                      data: st.DataObject) -> None:
    overlap = data.draw(st.integers(0, window - 2))
    stream = [t for piece in pieces for t in piece]
    windower = Windower("f", window, overlap)
    out = [w for piece in pieces for w in windower.push(piece)] + windower.finish()
    exported: list[int] = []
    for item in out:
        assert 2 <= len(item.tokens) <= window
        assert item.tokens == stream[item.first: item.first + len(item.tokens)]
        assert item.export_from == max(item.first + 1, len(exported) + 1)
        assert item.first == 0 or item.export_from - item.first == max(overlap, 1)
        exported.extend(range(item.export_from, item.first + len(item.tokens)))
    assert exported == list(range(1, len(stream)))


def test_pieces_end_at_line_boundaries(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "f.txt"
    data = b"".join(f"line {i} ".encode() * (i % 7) + b"\n" for i in range(2000))
    path.write_bytes(data)
    pieces = list(read_pieces(path, piece_bytes=100))
    assert b"".join(pieces) == data
    assert all(p.endswith(b"\n") for p in pieces)


def test_pieces_tokenise_like_the_whole_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pathlib import Path

    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(__file__).resolve().parents[3] / "models/pycoder-23m/tokenizer.json"))
    path = tmp_path / "f.py"
    body = "".join(f"def f{i}(x):\n\n    if x:\n        return {i}\n\n\n" for i in range(300))
    path.write_text(body)
    pieces = list(read_pieces(path, piece_bytes=100))
    assert len(pieces) > 10
    assert all(p[:1] not in (b" ", b"\n") for p in pieces[1:])
    by_piece = [t for p in pieces for t in tokenizer.encode(p.decode(), add_special_tokens=False).ids]
    assert by_piece == tokenizer.encode(body, add_special_tokens=False).ids
