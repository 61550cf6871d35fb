"""Token n-gram drafting: continue the output the way an indexed token sequence continued it.

What vLLM's n-gram (prompt lookup) and suffix decoding do, as one small incremental index shared by
the prediction proposer (the request's prompt and its output so far as draft sources) and by the
codec's speculative exact decoding (a lane indexes its own output and what it was given).

The index maps every n-gram (``min_n`` ≤ n ≤ ``max_n``) that has at least one token after it to the
position of that token, most recent registration winning. An n-gram is registered only when its
continuation token is appended, so a match ending exactly at the end of a sequence is never found:
a lane may index its own output and query with that same output. n-grams are keyed by a polynomial
rolling hash over prefix hashes (O(1) per n-gram, so O(max_n) per appended token); a hit is checked
against the tokens themselves, so a hash collision can only cost a draft, never give a wrong one.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

_MODULUS = (1 << 61) - 1
_BASE = 1_000_003


@dataclass(frozen=True)
class NgramMatch:
    """Where the longest matching n-gram continues: ``tokens(key)[position:]`` follows it."""

    key: Hashable
    position: int
    length: int


class _Sequence:
    __slots__ = ("prefix_hashes", "tokens")

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.prefix_hashes: list[int] = [0]


class TokenNgramSource:
    """Drafts the continuation of the longest recent n-gram of `context` found in indexed token sequences."""

    def __init__(self, min_n: int = 2, max_n: int = 16) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.min_n = min_n
        self.max_n = max_n
        self._powers = [1]
        for _ in range(max_n):
            self._powers.append(self._powers[-1] * _BASE % _MODULUS)
        self._sequences: dict[Hashable, _Sequence] = {}
        # _index[n - min_n][hash of an n-gram] = (key, position of the token after its latest occurrence)
        self._index: list[dict[int, tuple[Hashable, int]]] = [{} for _ in range(min_n, max_n + 1)]

    def add(self, key: Hashable, tokens: Sequence[int]) -> None:
        """Append ``tokens`` to sequence ``key`` (created when new) and index the n-grams they complete."""
        sequence = self._sequences.get(key)
        if sequence is None:
            sequence = self._sequences[key] = _Sequence()
        hashes, powers, min_n = sequence.prefix_hashes, self._powers, self.min_n
        for token in tokens:
            position = len(sequence.tokens)  # the n-grams ending just before this token now continue
            for n in range(min_n, min(self.max_n, position) + 1):
                ngram_hash = (hashes[position] - hashes[position - n] * powers[n]) % _MODULUS
                self._index[n - min_n][ngram_hash] = (key, position)
            token = int(token)  # numpy integers would overflow in the hash
            sequence.tokens.append(token)
            hashes.append((hashes[-1] * _BASE + token) % _MODULUS)

    def tokens(self, key: Hashable) -> list[int]:
        """The tokens indexed under ``key`` (empty when unknown); do not modify."""
        sequence = self._sequences.get(key)
        return sequence.tokens if sequence is not None else []

    def __contains__(self, key: Hashable) -> bool:
        return key in self._sequences

    def match(self, context: Sequence[int]) -> NgramMatch | None:
        """The longest suffix of ``context`` (``min_n``..``max_n`` tokens) indexed with a continuation,
        at its most recent occurrence; None when none is."""
        longest = min(self.max_n, len(context))
        if longest < self.min_n:
            return None
        suffix_hashes = [0] * (longest + 1)
        for n in range(1, longest + 1):
            suffix_hashes[n] = (int(context[-n]) * self._powers[n - 1] + suffix_hashes[n - 1]) % _MODULUS
        for n in range(longest, self.min_n - 1, -1):
            hit = self._index[n - self.min_n].get(suffix_hashes[n])
            if hit is None:
                continue
            key, position = hit
            indexed = self._sequences[key].tokens
            if indexed[position - n:position] == [int(t) for t in context[-n:]]:
                return NgramMatch(key, position, n)
        return None

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens that followed the longest recent n-gram ending ``context``; [] when no match."""
        if k <= 0:
            return []
        found = self.match(context)
        if found is None:
            return []
        return self._sequences[found.key].tokens[found.position:found.position + k]
