"""Decode passes of a fixed shape, replayed as CUDA graphs on a GPU.

Why: a decode pass of the torch kernel set is ~1,500 small kernels. Launched one by one from Python a
GPU spends ~8–13 ms a step on launches (an H200 decoded 4 KiB 5× slower than 16 CPU threads:
benchmarks/RESULTS.md, "The exact codec on a CUDA GPU"); a captured graph launches them as one.

A graph replays one shape, so a pass is given shapes known in advance, each of which leaves every
integer as it is:

- **attention reads the cache's whole capacity** (``span``), not only up to the furthest query: the
  extra keys are masked, their weights are exactly 0, and every sum stays the same exact integer;
- **queries are padded to a power of two** by repeating the pass's last query (same token, row and
  position): it stores the same key and value in the same slot, and its hidden states are dropped.

A shape's first pass runs eagerly (the warm-up a capture needs); after that it is captured once per
cache layout and replayed while the cache's tensors stay the same (the cohort allocates a GPU cache at
the rows' whole need at once, so that is until rows join or leave). Off a GPU, or under
``root.machine()`` (whose root is a host step), the same padded pass runs eagerly: that is what the
CPU tests check against ``ExactLlama.verify``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from cascade.codec.exact import root
from cascade.codec.exact.cache import KVCache
from cascade.codec.exact.model import ExactLlama


def padded_size(n: int) -> int:
    """The pass size ``n`` queries run as: the next power of two."""
    return 1 << max(0, n - 1).bit_length()


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: torch.Tensor
    """``(3, size)``: tokens, cache rows, positions (copied in before each replay)."""
    hidden: torch.Tensor


class GraphedVerify:
    """``ExactLlama.verify`` of one cohort's passes, padded to fixed shapes and, on a GPU, replayed."""

    def __init__(self, model: ExactLlama, capture: bool = True) -> None:
        self.model = model
        self.capture = capture and model.device.type == "cuda"
        self._layout: tuple[int, ...] | None = None
        self._graphs: dict[int, _Graph] = {}
        self._warm: set[int] = set()
        self._pool: tuple[int, int] | None = None
        self._stream: torch.cuda.Stream | None = None
        self.captures = 0
        self.capture_seconds = 0.0
        self.replays = 0

    def __call__(self, tokens: list[int], rows: list[int], positions: list[int], cache: KVCache) -> torch.Tensor:
        """Final hidden states of ``tokens`` at ``positions`` of cache rows ``rows`` (``verify``'s meaning)."""
        n = len(tokens)
        size = padded_size(n)
        pad = size - n
        inputs = torch.tensor([tokens + tokens[-1:] * pad, rows + rows[-1:] * pad, positions + positions[-1:] * pad],
                              dtype=torch.int64)
        if not self.capture or root.machine_active() or size not in self._warm:
            self._warm.add(size)  # a first pass of a shape runs eagerly: lazy set-up happens outside a capture
            tokens_, rows_, positions_ = inputs.to(self.model.device)  # one copy to the device, not three
            return self.model.verify(tokens_, cache, rows_, positions_, span=cache.capacity)[:n]
        self._forget_if_reshaped(cache)
        graph = self._graphs.get(size)
        if graph is None:
            graph = self._graphs[size] = self._capture(size, cache)
        graph.inputs.copy_(inputs)
        graph.graph.replay()
        self.replays += 1
        return graph.hidden[:n].clone()

    def _forget_if_reshaped(self, cache: KVCache) -> None:
        """Graphs read the cache's tensors by address: new tensors (rows joined or left, capacity grew)
        need new graphs, and the old ones (and their memory) go."""
        layout = (cache.rows, cache.capacity, *(t.data_ptr() for t in (*cache.keys, *cache.values)))
        if layout != self._layout:
            self._layout = layout
            self._graphs.clear()
            self._pool = None

    def _capture(self, size: int, cache: KVCache) -> _Graph:
        """Record the pass on a side stream (the default stream cannot be captured) into this layout's
        memory pool; unlike ``torch.cuda.graph`` it keeps the allocator's cache (no ``empty_cache`` per
        capture, and a layout is captured a few times)."""
        device = self.model.device
        start = time.perf_counter()
        inputs = torch.zeros(3, size, dtype=torch.int64, device=device)
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
        self._stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(self._stream):
            graph.capture_begin(self._pool, capture_error_mode="thread_local")
            try:
                hidden = self.model.verify(inputs[0], cache, inputs[1], inputs[2], span=cache.capacity)
            finally:
                graph.capture_end()
        torch.cuda.current_stream(device).wait_stream(self._stream)
        self.captures += 1
        self.capture_seconds += time.perf_counter() - start
        return _Graph(graph, inputs, hidden)
