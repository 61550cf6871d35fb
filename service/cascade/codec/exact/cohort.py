"""The decode cohort's KV rows: rows join (prompt prefilled once per segment, copied to its lanes) and
leave at any step, and the cache grows only as far as live rows have reached.

The cache is one rectangle, rows × capacity positions. Capacity grows in blocks as rows advance and
shrinks when rows leave, never beyond the longest position a live row may still need, so its size is
at most ``rows × longest need × bytes per row-position`` — the quantity the runner admits against
its budget. Reshaping (a row joins, rows leave, capacity grows) briefly holds a second copy. A cohort
whose passes replay as CUDA graphs (``graphs``) takes that whole need at once: a graph reads the cache
by address, so each growth would mean new graphs.
"""

from __future__ import annotations

from typing import Any

import torch

from cascade.codec.exact.cache import KVCache
from cascade.codec.exact.graphs import GraphedVerify
from cascade.codec.exact.model import ExactLlama

GROW_POSITIONS = 64


class Cohort:
    """Rows of the segments being decoded: per row its owner and lane, the token it feeds next
    (``pending``: the last token decoded, or the prompt's last token before the lane's first) and the
    positions it may need.

    A row's cache holds every position before its pending token's. Each ``step`` feeds every row its
    pending token and, optionally, a draft of the tokens after it, in one multi-position pass
    (``ExactLlama.verify``); ``advance`` then keeps only the positions whose tokens were decoded.
    ``owners[i]`` is any object (the runner's job); rows of one owner stay in the order they joined.
    With ``graphs``, passes run through ``GraphedVerify`` (fixed shapes, CUDA graphs on a GPU) and the
    cache takes its rows' whole need at once.
    """

    def __init__(self, model: ExactLlama, graphs: bool = False) -> None:
        self.model = model
        self.graphs = GraphedVerify(model) if graphs else None
        self.cache: KVCache | None = None
        self.owners: list[Any] = []
        self.lanes: list[int] = []
        self.needs: list[int] = []
        self.pending: list[int] = []

    def __len__(self) -> int:
        return len(self.owners)

    @property
    def capacity(self) -> int:
        return 0 if self.cache is None else self.cache.capacity

    def longest_need(self) -> int:
        return max(self.needs, default=0)

    def lengths(self) -> list[int]:
        """Cached positions per row (the position of its pending token)."""
        return [] if self.cache is None else [int(n) for n in self.cache.lengths.tolist()]

    def nbytes(self) -> int:
        """Bytes of the cached keys and values (what the budget counts)."""
        return 0 if self.cache is None else self.cache.nbytes()

    def join(self, segments: list[tuple[Any, list[int], list[int], int]]) -> None:
        """Add segments ``(owner, prompt, lanes, need)``: each prompt but its last token is prefilled
        once, in one batched pass, and its keys and values copied into every lane's row; the last
        token is every lane's pending token (its step gives the lane's first distribution)."""
        if not segments:
            return
        device = self.model.device
        heads = [prompt[:-1] for _, prompt, _, _ in segments]
        width = max(self.capacity, max(len(p) for p in heads), 1)
        if self.cache is not None and width > self.capacity:
            self.cache.resize(width)
        count = sum(len(lanes) for _, _, lanes, _ in segments)
        fresh = self.model.allocate_cache(count, width)
        firsts, row = [], 0
        for _, _, lanes, _ in segments:
            firsts.append(row)
            row += len(lanes)
        filled = [i for i, head in enumerate(heads) if head]
        if filled:
            self.model.prefill([heads[i] for i in filled], fresh, [firsts[i] for i in filled])
        for first, head, (_, _, lanes, _) in zip(firsts, heads, segments, strict=True):
            if len(lanes) > 1 and head:
                fresh.copy_prefix(first, torch.arange(first + 1, first + len(lanes), device=device), len(head))
        if self.cache is None:
            self.cache = fresh
        else:
            self.cache.append(fresh)
        for owner, prompt, lanes, need in segments:
            self.owners += [owner] * len(lanes)
            self.lanes += lanes
            self.needs += [need] * len(lanes)
            self.pending += [prompt[-1]] * len(lanes)

    def keep(self, keep: list[int]) -> None:
        """Only rows ``keep`` stay (in order); capacity shrinks to what they may still need."""
        if len(keep) == len(self.owners):
            return
        if not keep:
            self.cache = None
            self.owners, self.lanes, self.needs, self.pending = [], [], [], []
            return
        assert self.cache is not None
        index = torch.tensor(keep, device=self.model.device)
        self.owners = [self.owners[i] for i in keep]
        self.lanes = [self.lanes[i] for i in keep]
        self.needs = [self.needs[i] for i in keep]
        self.pending = [self.pending[i] for i in keep]
        lengths = self.cache.lengths[index]
        capacity = min(self.capacity, max(self.longest_need(), int(lengths.max())))
        self.cache.resize(capacity, index)

    def step(self, drafts: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
        """Feed every row its pending token followed by its draft (``drafts[i]``, possibly empty, never
        past the row's need) in one pass. Returns the final hidden states, ``1 + len(drafts[i])`` per row
        in row order (row ``i``'s ``j``-th gives the distribution of the token after its ``j``-th fed
        one), and where each row's first state is. Capacity grows first (in blocks, never past the
        rows' needs); lengths are left to ``advance``."""
        assert self.cache is not None
        lengths = self.lengths()
        tokens: list[int] = []
        rows: list[int] = []
        positions: list[int] = []
        starts: list[int] = []
        for i, (pending, draft, length) in enumerate(zip(self.pending, drafts, lengths, strict=True)):
            starts.append(len(tokens))
            tokens += [pending, *draft]
            rows += [i] * (1 + len(draft))
            positions += range(length, length + 1 + len(draft))
        span = max(positions) + 1
        if span > self.capacity:
            # replayed graphs read the cache by address: a GPU cache takes the rows' whole need at once
            block = self.longest_need() if self.graphs is not None else self.capacity + GROW_POSITIONS
            self.cache.resize(min(max(span, block), max(self.longest_need(), span)))
        if self.graphs is not None:
            return self.graphs(tokens, rows, positions, self.cache), starts
        device = self.model.device
        hidden = self.model.verify(torch.tensor(tokens, dtype=torch.int64, device=device), self.cache,
                                   torch.tensor(rows, dtype=torch.int64, device=device),
                                   torch.tensor(positions, dtype=torch.int64, device=device))
        return hidden, starts

    def advance(self, accepted: list[int], pending: list[int]) -> None:
        """Row ``i`` keeps ``accepted[i]`` fed positions (its pending token and the draft tokens that
        matched what was decoded) and feeds ``pending[i]`` next; the rest of its pass is discarded."""
        assert self.cache is not None
        self.cache.lengths += torch.tensor(accepted, dtype=torch.int64, device=self.cache.lengths.device)
        self.pending = list(pending)
