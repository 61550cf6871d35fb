"""The exact model's KV cache: keys and values as fixed-point integers, one rectangle of rows × positions.

One type serves every pass (prefill, decode steps, speculative verify) and the runner's decode cohort:
rows join (``append``), leave (``keep``), share a prefilled context (``copy_prefix``) and the capacity
grows or shrinks with what live rows still need (``resize``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from cascade.codec.exact.model import ExactConfig


def bytes_per_row_position(config: ExactConfig, dtype: torch.dtype = torch.int32) -> int:
    """KV-cache bytes one row needs per position (keys and values of every layer), for admission."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * itemsize


@dataclass
class KVCache:
    """Per layer: keys and values as fixed-point integers, ``(rows, kv_heads, capacity, head_dim)``.

    Integers in int32 (every clamp bound of the model fits; ``ExactLlama.cache_dtype`` says which
    dtype a model needs — int64 only for contexts under 64 positions). Row ``r`` holds
    ``lengths[r]`` valid positions; everything past them is ignored (masked) by attention. Every
    tensor stays contiguous (the compiled kernels write into it in place)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    lengths: torch.Tensor

    @classmethod
    def allocate(cls, rows: int, length: int, layers: int, kv_heads: int, head_dim: int,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.int32) -> KVCache:
        shape = (rows, kv_heads, length, head_dim)
        return cls([torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)],
                   [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)],
                   torch.zeros(rows, dtype=torch.int64, device=device))

    @property
    def rows(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def capacity(self) -> int:
        return int(self.keys[0].shape[2]) if self.keys else 0

    @property
    def device(self) -> torch.device:
        return self.lengths.device

    @property
    def dtype(self) -> torch.dtype:
        return self.keys[0].dtype if self.keys else torch.int32

    def nbytes(self) -> int:
        """Bytes held by the cached keys and values (what the runner's budget counts)."""
        return sum(t.numel() * t.element_size() for t in [*self.keys, *self.values])

    def keep(self, rows: torch.Tensor) -> None:
        """Drop every row not in ``rows`` (finished sequences), so steps touch only live ones."""
        self.resize(self.capacity, rows)

    def resize(self, capacity: int, rows: torch.Tensor | None = None) -> None:
        """Keep only ``rows`` (all when None, in their order) and ``capacity`` positions (zero-padded
        or cut: a cut keeps every position a live row still reads only if the caller chose it so)."""
        index = None if rows is None else rows.to(device=self.device, dtype=torch.int64)
        self.keys = [_fit(k, index, capacity) for k in self.keys]
        self.values = [_fit(v, index, capacity) for v in self.values]
        if index is not None:
            self.lengths = self.lengths[index]

    def append(self, other: KVCache) -> None:
        """Add ``other``'s rows after this cache's rows (a segment joining a running cohort); the
        capacity becomes the larger of the two, the shorter side padded with unused positions."""
        if len(other.keys) != len(self.keys) or other.dtype != self.dtype or other.device != self.device:
            raise ValueError("caches of different layers, dtype or device cannot be joined")
        if self.keys and other.keys[0].shape[1::2] != self.keys[0].shape[1::2]:
            raise ValueError("caches of different head shapes cannot be joined")
        capacity = max(self.capacity, other.capacity)
        self.keys = [torch.cat([_fit(a, None, capacity), _fit(b, None, capacity)])
                     for a, b in zip(self.keys, other.keys, strict=True)]
        self.values = [torch.cat([_fit(a, None, capacity), _fit(b, None, capacity)])
                       for a, b in zip(self.values, other.values, strict=True)]
        self.lengths = torch.cat([self.lengths, other.lengths])

    def copy_prefix(self, src_row: int, dst_rows: torch.Tensor, length: int) -> None:
        """Copy row ``src_row``'s first ``length`` positions into every row of ``dst_rows`` and set
        their lengths to ``length``: a segment's shared context, computed once, for each lane (reading a
        copy: torch refuses an index-put whose source views the written tensor)."""
        if not 0 <= length <= int(self.lengths[src_row]):
            raise ValueError(f"row {src_row} holds {int(self.lengths[src_row])} positions, not {length}")
        dst = dst_rows.to(device=self.device, dtype=torch.int64)
        for tensors in (self.keys, self.values):
            for t in tensors:
                t[dst, :, :length] = t[src_row, :, :length].clone()
        self.lengths[dst] = length


def _fit(t: torch.Tensor, rows: torch.Tensor | None, capacity: int) -> torch.Tensor:
    """``t``'s ``rows`` (all when None) with ``capacity`` positions, contiguous."""
    if rows is not None:
        t = t[rows]
    have = t.shape[2]
    if capacity < have:
        return t[:, :, :capacity].contiguous()
    if capacity > have:
        return torch.cat([t, t.new_zeros(t.shape[0], t.shape[1], capacity - have, t.shape[3])], dim=2)
    return t
