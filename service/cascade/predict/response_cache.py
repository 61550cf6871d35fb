"""Earlier responses of one engine as a draft source, what suffix decoding's global tree is to vLLM.

Users of predicted outputs send the same kind of request again and again: an agent re-applies an edit
to the next file, a retry asks the very question it asked before, a test suite sends one prompt per
case. The answers repeat each other far more than they repeat their own prompt, and a greedy retry
is the earlier answer token for token. So every finished response of a request with a prediction is
kept (``add``) and indexed as its own sequence of a ``TokenNgramSource``; a request drafts from it
like from its prompt and its output (``PredictionState``'s ``responses`` source).

Responses are kept per ``scope``: the OpenAI ``user`` of the request, or one anonymous scope for
requests without one. How fast a request runs tells its sender whether an earlier response of the
same scope continued the same way, so a deployment serving tenants that must not learn about each
other sets ``user`` per tenant, or switches the cache off (``prediction_response_cache_tokens`` 0).
The cache holds at most ``max_tokens`` tokens over all scopes; the oldest responses go first (their
scope's index is rebuilt from what is left, at most once per quarter of the budget).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from cascade.predict.token_source import TokenNgramSource

NGRAM_MIN = 2
NGRAM_MAX = 16  # each kept token costs one index entry per n-gram length: ~1.5 KB of memory a token
MIN_RESPONSE_TOKENS = 4  # shorter answers (a warm-up, a refusal) draft nothing worth keeping


class _Scope:
    def __init__(self) -> None:
        self.responses: deque[tuple[int, list[int]]] = deque()
        self.index = TokenNgramSource(NGRAM_MIN, NGRAM_MAX)

    def rebuild(self) -> None:
        self.index = TokenNgramSource(NGRAM_MIN, NGRAM_MAX)
        for serial, tokens in self.responses:
            self.index.add(serial, tokens)


class ResponseCache:
    """The last responses of each scope, indexed for n-gram drafting; bounded in tokens."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max(0, max_tokens)
        self._scopes: dict[str, _Scope] = {}
        self._order: deque[str] = deque()  # scope of every kept response, oldest first
        self._serial = 0
        self.tokens = 0

    def __len__(self) -> int:
        return len(self._order)

    def source(self, scope: str) -> TokenNgramSource | None:
        """The index of ``scope``'s responses; None when it has none. Later ``add``s show in it until an
        eviction rebuilds the scope's index (the old one stays valid, only stale)."""
        found = self._scopes.get(scope)
        return None if found is None else found.index

    def add(self, scope: str, tokens: Sequence[int]) -> None:
        """Keep a finished response (too short or larger than the whole budget: ignored)."""
        tokens = [int(t) for t in tokens]
        if not MIN_RESPONSE_TOKENS <= len(tokens) <= self.max_tokens:
            return
        entry = self._scopes.setdefault(scope, _Scope())
        self._serial += 1
        entry.responses.append((self._serial, tokens))
        entry.index.add(self._serial, tokens)
        self._order.append(scope)
        self.tokens += len(tokens)
        if self.tokens > self.max_tokens:
            self._evict(self.max_tokens - self.max_tokens // 4)

    def _evict(self, down_to: int) -> None:
        touched: set[str] = set()
        while self.tokens > down_to and self._order:
            scope = self._order.popleft()
            entry = self._scopes[scope]
            _, tokens = entry.responses.popleft()
            self.tokens -= len(tokens)
            touched.add(scope)
        for scope in touched:
            entry = self._scopes[scope]
            if entry.responses:
                entry.rebuild()
            else:
                del self._scopes[scope]
