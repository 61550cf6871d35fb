"""Stand-ins for vLLM's log-probability layouts, so the pure cores are tested without vLLM."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Lp:
    """vLLM's ``Logprob``: one candidate's log-probability and rank."""

    logprob: float
    rank: int | None = None


@dataclass
class Flat:
    """vLLM's ``FlatLogprobs``: per position the actual (or sampled) token, then the engine's top-k."""

    start_indices: list[int] = field(default_factory=list)
    end_indices: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    ranks: list[int | None] = field(default_factory=list)

    def append(self, entries: list[tuple[int, float, int | None]] | None) -> None:
        self.start_indices.append(len(self.token_ids))
        for token, value, rank in entries or []:
            self.token_ids.append(token)
            self.logprobs.append(value)
            self.ranks.append(rank)
        self.end_indices.append(len(self.token_ids))

    def __getitem__(self, index: int) -> dict[int, Lp] | None:
        span = range(self.start_indices[index], self.end_indices[index])
        return {self.token_ids[i]: Lp(self.logprobs[i], self.ranks[i]) for i in span} or None

    def __len__(self) -> int:
        return len(self.start_indices)
