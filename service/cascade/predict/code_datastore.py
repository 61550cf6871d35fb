"""Drafts for new code from code written elsewhere: a datastore of which token follows which n-gram.

Where the output writes new code, the prediction, the prompt and the output so far have nothing to
copy: at 80 % of such steps in replayed edits the next token had never followed the last one anywhere
in the request. Code written elsewhere has: after ``def __init__(self`` comes ``,`` or ``)``, after
``raise`` comes `` ValueError``. This is retrieval-based drafting (REST, He et al. 2023): counts of
the token after every n-gram (1 ≤ n ≤ ``max_n``) of a corpus tokenised by the served model's
tokenizer; the draft is the most frequent successor of the context's longest known suffix, token by
token, while the product of the count ratios stays at or above a probability.

Pure numpy: per n, a sorted array of n-gram hashes (polynomial, modulo 2**64: numpy's ``uint64``
wraps as Python's masked integers do) with each n-gram's most frequent successor (ties: the smallest
id) and its share of the n-gram's occurrences; n-grams seen fewer than ``min_count`` times are left
out. A hash collision can only give a wrong draft, which verification rejects.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from cascade.predict.successor_counts import likely_draft

_BASE = 0x100000001B3
_MASK = (1 << 64) - 1
_FIELDS = ("hashes", "tokens", "shares")
Table = tuple[np.ndarray, np.ndarray, np.ndarray]  # sorted n-gram hashes, most frequent successor, its share


def _context_hashes(context: Sequence[int], max_n: int) -> list[int]:
    """The hash of the context's last n tokens for n = 1..max_n (index n − 1)."""
    hashes: list[int] = []
    for n in range(1, min(max_n, len(context)) + 1):
        h = 0
        for token in context[-n:]:
            h = (h * _BASE + int(token)) & _MASK
        hashes.append(h)
    return hashes


def _ngram_table(sequences: Sequence[np.ndarray], n: int, min_count: int) -> Table:
    """(sorted hashes, most frequent successor, its share) of every n-gram seen ≥ ``min_count`` times."""
    hash_parts, next_parts = [], []
    for tokens in sequences:
        if len(tokens) <= n:
            continue
        h = np.zeros(len(tokens) - n, dtype=np.uint64)
        for j in range(n):
            h = h * np.uint64(_BASE) + tokens[j:len(tokens) - n + j]
        hash_parts.append(h)
        next_parts.append(tokens[n:])
    if not hash_parts:
        return np.zeros(0, np.uint64), np.zeros(0, np.int32), np.zeros(0, np.float32)
    hashes, nexts = np.concatenate(hash_parts), np.concatenate(next_parts)
    order = np.lexsort((nexts, hashes))
    hashes, nexts = hashes[order], nexts[order]
    pair_starts = np.flatnonzero(np.r_[True, (hashes[1:] != hashes[:-1]) | (nexts[1:] != nexts[:-1])])
    pair_hashes, pair_tokens = hashes[pair_starts], nexts[pair_starts]
    pair_counts = np.diff(np.r_[pair_starts, len(hashes)])
    starts = np.flatnonzero(np.r_[True, pair_hashes[1:] != pair_hashes[:-1]])
    totals = np.add.reduceat(pair_counts, starts)
    best = np.maximum.reduceat(pair_counts, starts)
    sizes = np.diff(np.r_[starts, len(pair_hashes)])
    winners = np.flatnonzero(pair_counts == np.repeat(best, sizes))
    group = np.searchsorted(starts, winners, side="right") - 1
    first = winners[np.r_[True, group[1:] != group[:-1]]]  # the smallest id among equally frequent
    keep = totals >= min_count
    return (pair_hashes[starts][keep], pair_tokens[first][keep].astype(np.int32),
            (best / totals)[keep].astype(np.float32))


class CodeDatastore:
    """The most frequent successor of every n-gram of a tokenised corpus, with its share."""

    def __init__(self, tables: Sequence[Table]) -> None:
        self.tables = list(tables)
        self.max_n = len(self.tables)

    @classmethod
    def build(cls, sequences: Iterable[Sequence[int]], max_n: int = 4, min_count: int = 2) -> CodeDatastore:
        arrays = [np.asarray(s, dtype=np.uint64) for s in sequences]
        return cls([_ngram_table(arrays, n, min_count) for n in range(1, max_n + 1)])

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        for n, table in enumerate(self.tables, 1):
            for field, array in zip(_FIELDS, table, strict=True):
                np.save(directory / f"{field}{n}.npy", array)

    @classmethod
    def load(cls, directory: Path) -> CodeDatastore:
        """Memory-mapped: engines of one machine share the pages."""
        tables: list[Table] = []
        n = 1
        while (directory / f"hashes{n}.npy").exists():
            hashes, tokens, shares = (np.load(directory / f"{field}{n}.npy", mmap_mode="r") for field in _FIELDS)
            tables.append((hashes, tokens, shares))
            n += 1
        return cls(tables)

    @property
    def ngrams(self) -> int:
        return sum(len(table[0]) for table in self.tables)

    def successor(self, context: Sequence[int]) -> tuple[int, float] | None:
        """The most frequent successor of the context's longest known suffix, with its share."""
        hashes = _context_hashes(context, self.max_n)
        for n in range(len(hashes), 0, -1):
            keys, tokens, shares = self.tables[n - 1]
            h = np.uint64(hashes[n - 1])
            i = int(np.searchsorted(keys, h))
            if i < len(keys) and keys[i] == h:
                return int(tokens[i]), float(shares[i])
        return None

    def propose(self, context: Sequence[int], k: int, min_probability: float) -> list[int]:
        """Up to ``k`` tokens, each the most frequent successor of the context extended by the draft so
        far, while the product of their shares stays ≥ ``min_probability``."""
        return likely_draft(self.successor, context, k, min_probability, self.max_n)
