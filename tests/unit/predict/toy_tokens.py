"""A toy word-level tokenizer: words, spaces and newlines are tokens; "x\\n"-style tokens exist too.

It is a ``Vocabulary`` (token bytes and an encoder), so tests can also write the same text with other
token boundaries than ``encode`` gives (``split``), as a model may."""

from __future__ import annotations

import re


class ToyTokenizer:
    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}
        self.pieces: list[bytes] = []

    def id(self, piece: str) -> int:
        if piece not in self.vocab:
            self.vocab[piece] = len(self.pieces)
            self.pieces.append(piece.encode())
        return self.vocab[piece]

    def encode_text(self, text: str) -> list[int]:
        return [self.id(p) for p in re.findall(r"\w+:\n|\w+|\s|[^\w\s]", text)]

    def encode(self, data: bytes) -> list[int]:
        return self.encode_text(data.decode())

    def piece(self, token: int) -> bytes:
        return self.pieces[token]

    def split(self, text: str, at: str) -> list[int]:
        """``text`` tokenised, except that every occurrence of ``at`` (two characters or more) becomes two
        tokens."""
        head, tail = at[: len(at) // 2], at[len(at) // 2:]
        marked = text.replace(at, "\0")
        tokens: list[int] = []
        for i, part in enumerate(marked.split("\0")):
            if i:
                tokens += [self.id(head), self.id(tail)]
            tokens += self.encode_text(part)
        return tokens


CODE = """def load(path):
    with open(path) as handle:
        data = handle.read()
    return parse(data)

def parse(data):
    items = []
    for line in data.splitlines():
        items.append(line.strip())
    return items

def main():
    print(load("a.txt"))
"""
