"""The decode cohort's KV rows: rows join (prompt prefilled once per segment, copied to its lanes) and
leave at any step, and the cache grows only as far as live rows have reached.

The cache is one rectangle, rows × capacity positions. Capacity grows in blocks as rows advance and
shrinks when rows leave, never beyond the longest position a live row may still need, so its size is
at most ``rows × longest need × bytes per row-position`` — the quantity the runner admits against
its budget. Reshaping (a row joins, rows leave, capacity grows) briefly holds a second copy.
"""

from __future__ import annotations

from typing import Any

import torch

from cascade.codec.exact.model import ExactConfig, ExactLlama, KVCache

GROW_POSITIONS = 64


def bytes_per_row_position(config: ExactConfig) -> int:
    """Bytes one cached position of one row takes (every layer's key and value)."""
    probe = KVCache.allocate(1, 1, config.num_layers, config.num_kv_heads, config.head_dim)
    return sum(t.element_size() * t.numel() for t in (*probe.keys, *probe.values))


def _resize(cache: KVCache, rows: torch.Tensor | None, capacity: int) -> KVCache:
    """The cache with only ``rows`` (all when None) and ``capacity`` positions (zero-padded or cut)."""
    def one(t: torch.Tensor) -> torch.Tensor:
        if rows is not None:
            t = t[rows]
        have = t.shape[2]
        if capacity < have:
            return t[:, :, :capacity].contiguous()
        if capacity > have:
            pad = t.new_zeros(t.shape[0], t.shape[1], capacity - have, t.shape[3])
            return torch.cat([t, pad], dim=2)
        return t

    lengths = cache.lengths if rows is None else cache.lengths[rows]
    return KVCache([one(k) for k in cache.keys], [one(v) for v in cache.values], lengths)


def _append(cache: KVCache, other: KVCache) -> KVCache:
    return KVCache([torch.cat([a, b]) for a, b in zip(cache.keys, other.keys, strict=True)],
                   [torch.cat([a, b]) for a, b in zip(cache.values, other.values, strict=True)],
                   torch.cat([cache.lengths, other.lengths]))


def _copy_prefix(cache: KVCache, src: int, dst: list[int], length: int) -> None:
    if not dst:
        return
    index = torch.tensor(dst)
    for t in (*cache.keys, *cache.values):
        t[index, :, :length] = t[src, :, :length].clone()
    cache.lengths[index] = int(cache.lengths[src])


class Cohort:
    """Rows of the segments being decoded: per row its owner and lane, hidden state and needed positions.

    ``owners[i]`` is any object (the runner's job); rows of one owner stay in the order they joined.
    """

    def __init__(self, model: ExactLlama) -> None:
        self.model = model
        self.cache: KVCache | None = None
        self.owners: list[Any] = []
        self.lanes: list[int] = []
        self.needs: list[int] = []
        self.hidden: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.owners)

    @property
    def capacity(self) -> int:
        return 0 if self.cache is None else int(self.cache.keys[0].shape[2])

    def longest_need(self) -> int:
        return max(self.needs, default=0)

    def nbytes(self) -> int:
        if self.cache is None:
            return 0
        return sum(t.element_size() * t.numel() for t in (*self.cache.keys, *self.cache.values))

    def join(self, segments: list[tuple[Any, list[int], list[int], int]]) -> None:
        """Add segments ``(owner, prompt, lanes, need)``: each prompt is prefilled once, in one batched
        pass, and its keys and values copied into every lane's row; all lanes start from the prompt's
        last hidden state."""
        if not segments:
            return
        c = self.model.config
        prompts = [prompt for _, prompt, _, _ in segments]
        width = max(self.capacity, max(len(p) for p in prompts))
        if self.cache is not None and width > self.capacity:
            self.cache = _resize(self.cache, None, width)
        count = sum(len(lanes) for _, _, lanes, _ in segments)
        fresh = KVCache.allocate(count, width, c.num_layers, c.num_kv_heads, c.head_dim)
        firsts, row = [], 0
        for _, _, lanes, _ in segments:
            firsts.append(row)
            row += len(lanes)
        hidden = self.model.prefill(prompts, fresh, firsts)
        ends = torch.cumsum(torch.tensor([len(p) for p in prompts]), 0) - 1
        last = hidden[ends]
        for first, (_, prompt, lanes, _) in zip(firsts, segments, strict=True):
            _copy_prefix(fresh, first, list(range(first + 1, first + len(lanes))), len(prompt))
        repeats = torch.tensor([len(lanes) for _, _, lanes, _ in segments])
        fresh_hidden = last.repeat_interleave(repeats, dim=0)
        self.cache = fresh if self.cache is None else _append(self.cache, fresh)
        self.hidden = fresh_hidden if self.hidden is None else torch.cat([self.hidden, fresh_hidden])
        for owner, _, lanes, need in segments:
            self.owners += [owner] * len(lanes)
            self.lanes += lanes
            self.needs += [need] * len(lanes)

    def keep(self, keep: list[int]) -> None:
        """Only rows ``keep`` stay (in order); capacity shrinks to what they may still need."""
        if len(keep) == len(self.owners):
            return
        if not keep:
            self.cache, self.hidden = None, None
            self.owners, self.lanes, self.needs = [], [], []
            return
        assert self.cache is not None and self.hidden is not None
        index = torch.tensor(keep)
        self.owners = [self.owners[i] for i in keep]
        self.lanes = [self.lanes[i] for i in keep]
        self.needs = [self.needs[i] for i in keep]
        lengths = self.cache.lengths[index]
        capacity = min(self.capacity, max(self.longest_need(), int(lengths.max())))
        self.cache = _resize(self.cache, index, capacity)
        self.hidden = self.hidden[index]

    def step(self, tokens: torch.Tensor) -> None:
        """Feed every row its token; capacity grows (in blocks, never past the rows' needs) first."""
        assert self.cache is not None
        span = int(self.cache.lengths.max()) + 1
        if span > self.capacity:
            grown = min(max(span, self.capacity + GROW_POSITIONS), max(self.longest_need(), span))
            self.cache = _resize(self.cache, None, grown)
        self.hidden = self.model.step(tokens, self.cache)
