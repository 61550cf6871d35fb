"""Token n-gram drafting: continue the output the way an indexed token sequence continued it.

What vLLM's n-gram (prompt lookup) and suffix decoding do, as one small incremental index shared by
the prediction proposer (the request's prompt and its output so far as draft sources) and by the
codec's speculative exact decoding (a lane indexes its own output and what it was given).

The index maps every n-gram (``min_n`` ≤ n ≤ ``max_n``) that has at least one token after it to the
position of that token, most recent registration winning. An n-gram is registered only when its
continuation token is appended, so a match ending exactly at the end of a sequence is never found:
a lane may index its own output and query with that same output. n-grams are keyed by a polynomial
hash modulo 2³¹ − 1, built n by n (each n-gram's hash from its (n−1)-gram's: O(max_n) per appended
token); a long append (a prompt) computes them with numpy, a row of tokens at a time, which is what
keeps indexing a 4k-token prompt in a few milliseconds. A hit is checked against the tokens
themselves, so a hash collision can only cost a draft, never give a wrong one.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

_MODULUS = (1 << 31) - 1  # hash · base stays below 2**62: exact in int64
_BASE = 1_000_003
_BULK = 32  # appends of at least this many tokens are hashed with numpy
_POSITION_BITS = 40
_POSITION_MASK = (1 << _POSITION_BITS) - 1


@dataclass(frozen=True)
class NgramMatch:
    """Where the longest matching n-gram continues: ``tokens(key)[position:]`` follows it."""

    key: Hashable
    position: int
    length: int


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
        self._sequences: dict[Hashable, list[int]] = {}
        self._keys: list[Hashable] = []  # sequence number → key
        self._numbers: dict[Hashable, int] = {}
        # _index[n - min_n][hash of an n-gram] = where the token after its latest occurrence is, as
        # (sequence number << 40) | position (plain ints: indexing a prompt creates no tuples)
        self._index: list[dict[int, int]] = [{} for _ in range(min_n, max_n + 1)]

    def add(self, key: Hashable, tokens: Sequence[int]) -> None:
        """Append ``tokens`` to sequence ``key`` (created when new) and index the n-grams they complete."""
        if key not in self._sequences:
            self._numbers[key] = len(self._keys)
            self._keys.append(key)
        sequence = self._sequences.setdefault(key, [])
        base = self._numbers[key] << _POSITION_BITS
        start = len(sequence)
        sequence.extend(int(t) for t in tokens)  # numpy integers would overflow in the hash
        if len(sequence) - start >= _BULK:
            self._index_bulk(base, sequence, start)
            return
        powers, min_n = self._powers, self.min_n
        for position in range(max(start, 1), len(sequence)):  # n-grams ending before ``position`` now continue
            ngram_hash = 0
            for n in range(1, min(self.max_n, position) + 1):
                ngram_hash = (sequence[position - n] * powers[n - 1] + ngram_hash) % _MODULUS
                if n >= min_n:
                    self._index[n - min_n][ngram_hash] = base | position

    def _index_bulk(self, base: int, sequence: list[int], start: int) -> None:
        """``add``'s indexing for the tokens from ``start`` on, one numpy row per n-gram length."""
        window_start = max(0, start - self.max_n)
        window = np.asarray(sequence[window_start:], dtype=np.int64) % _MODULUS
        hashes = window
        for n in range(1, self.max_n + 1):
            if n > 1:
                hashes = (hashes[:-1] * _BASE + window[n - 1:]) % _MODULUS
            # the n-gram starting at window index i continues at absolute position window_start + i + n
            first = max(0, start - window_start - n)
            last = len(window) - n  # exclusive: a continuation token must exist
            if n < self.min_n or first >= last:
                continue
            positions = range(base | (window_start + first + n), base | (window_start + last + n))
            self._index[n - self.min_n].update(zip(hashes[first:last].tolist(), positions, strict=True))

    def tokens(self, key: Hashable) -> list[int]:
        """The tokens indexed under ``key`` (empty when unknown); do not modify."""
        return self._sequences.get(key, [])

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
            key, position = self._keys[hit >> _POSITION_BITS], hit & _POSITION_MASK
            indexed = self._sequences[key]
            if indexed[position - n:position] == [int(t) for t in context[-n:]]:
                return NgramMatch(key, position, n)
        return None

    def continuation(self, found: NgramMatch, k: int, looping: bool = False) -> list[int]:
        """Up to ``k`` tokens after ``found``. ``looping``: the indexed sequence is the context itself
        (an output indexing its own tokens), so a continuation that runs into its end has found the
        output repeating the stretch since the match, and the stretch repeats on: a loop of a few
        tokens drafts as far as a long one (what matching the earliest occurrence gives vLLM's n-gram)."""
        sequence = self._sequences[found.key]
        out = sequence[found.position:found.position + k]
        if looping and 0 < len(out) < k:
            period = len(out)
            out = [out[i % period] for i in range(k)]
        return out

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens that followed the longest recent n-gram ending ``context``; [] when no match."""
        if k <= 0:
            return []
        found = self.match(context)
        if found is None:
            return []
        return self.continuation(found, k)
