"""Which token usually follows the last few tokens: counts over the prompt and the output so far.

The fallback source of the prediction proposer for new text, where neither the prediction nor a long
n-gram has anything to offer: like suffix decoding's short matches, it drafts the most frequent
continuation of the context's last 1..``max_n`` tokens while the estimated probability of the whole
draft (the product of count ratios) stays at or above ``min_probability``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Successor = Callable[[Sequence[int]], tuple[int, float] | None]


def likely_draft(successor: Successor, context: Sequence[int], k: int, min_probability: float,
                 window: int) -> list[int]:
    """Up to ``k`` tokens, each ``successor`` of the context's last ``window`` tokens extended by the draft
    so far, while the product of their shares stays ≥ ``min_probability``."""
    recent = [int(t) for t in context[-window:]]
    draft: list[int] = []
    probability = 1.0
    while len(draft) < k:
        found = successor(recent)
        if found is None:
            break
        token, share = found
        probability *= share
        if probability < min_probability:
            break
        draft.append(token)
        recent = [*recent, token][-window:]
    return draft


class SuccessorCounts:
    """Counts of the token after every n-gram (1 ≤ n ≤ ``max_n``) of the indexed streams."""

    def __init__(self, max_n: int = 3) -> None:
        self.max_n = max_n
        self._counts: dict[tuple[int, ...], dict[int, int]] = {}
        self._totals: dict[tuple[int, ...], int] = {}
        self._recent: list[int] = []

    def add(self, tokens: Sequence[int], new_stream: bool = False) -> None:
        """Append ``tokens`` to the current stream (``new_stream``: start another one, so no n-gram
        spans the two)."""
        if new_stream:
            self._recent = []
        for token in tokens:
            token = int(token)
            for n in range(1, min(self.max_n, len(self._recent)) + 1):
                key = tuple(self._recent[-n:])
                successors = self._counts.setdefault(key, {})
                successors[token] = successors.get(token, 0) + 1
                self._totals[key] = self._totals.get(key, 0) + 1
            self._recent = [*self._recent, token][-self.max_n:]

    def successor(self, context: Sequence[int], min_count: int = 2) -> tuple[int, float] | None:
        """The most frequent successor of the context's longest suffix seen ≥ ``min_count`` times, with
        its share of that suffix's successors."""
        recent = [int(t) for t in context[-self.max_n:]]
        for n in range(min(self.max_n, len(recent)), 0, -1):
            key = tuple(recent[-n:])
            total = self._totals.get(key, 0)
            if total >= min_count:
                successors = self._counts[key]
                token = max(successors, key=successors.__getitem__)
                return token, successors[token] / total
        return None

    def propose(self, context: Sequence[int], k: int, min_probability: float, min_count: int = 2) -> list[int]:
        """Up to ``k`` tokens, each the most frequent successor of the longest known suffix (seen at
        least ``min_count`` times) of the context extended by the draft so far."""
        return likely_draft(lambda recent: self.successor(recent, min_count), context, k, min_probability,
                            self.max_n)
