"""A toy word-level tokenizer: words, spaces and newlines are tokens; "x\\n"-style tokens exist too."""

from __future__ import annotations

import re


class ToyTokenizer:
    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}

    def id(self, piece: str) -> int:
        return self.vocab.setdefault(piece, len(self.vocab))

    def encode(self, text: str) -> list[int]:
        return [self.id(p) for p in re.findall(r"\w+:\n|\w+|\s|[^\w\s]", text)]

    def newline_ids(self) -> frozenset[int]:
        return frozenset(i for piece, i in self.vocab.items() if "\n" in piece)


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
