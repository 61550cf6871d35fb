"""The codec role's batched runner: one worker thread drives the exact model for every request.

Compression jobs (teacher forcing) go through batched prefill: the lanes of every waiting segment,
of every request, packed into as few forward passes as the token budget allows. Decompression jobs
form a cohort: every lane of every waiting segment gets a KV-cache row, and each model step
advances all of them at once while each segment's range decoder picks its lanes' tokens — the
model proposes the distribution, the coder picks the token. Between decode steps waiting
compression batches run, so neither direction starves the other. Because the model's integers do
not depend on batch composition (see ``model``), any grouping gives the same bits.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import torch

from cascade.codec.exact.frequencies import frequency_tables, rank_to_token, token_intervals
from cascade.codec.exact.model import LOGIT_FRACTION_BITS, ExactLlama, KVCache
from cascade.codec.lanes import LaneDecoder, LaneSymbols, encode_lanes

logger = logging.getLogger("cascade.codec")
T = TypeVar("T")
_LOGIT_ROWS = 1024


@dataclass(frozen=True)
class EncodedSegment:
    payload: bytes
    tokens: int
    ideal_bits: float


@dataclass
class _EncodeJob:
    prompt: list[int]
    lanes: list[list[int]]
    top_k: int
    precision_bits: int
    future: Future[EncodedSegment] = field(default_factory=Future)


@dataclass
class _DecodeJob:
    prompt: list[int]
    lengths: list[int]
    payload: bytes
    top_k: int
    precision_bits: int
    future: Future[list[list[int]]] = field(default_factory=Future)
    cancelled: bool = False
    decoded: list[list[int]] = field(default_factory=list)
    coder: LaneDecoder | None = None


class RunnerClosedError(RuntimeError):
    """The runner was shut down while a job waited."""


def ideal_bits(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Per row, the exact model's own code length for its token (statistics only; not in the coding path)."""
    z = logits.to(torch.float64) / float(1 << LOGIT_FRACTION_BITS)
    return (torch.logsumexp(z, dim=1) - z.gather(1, tokens[:, None])[:, 0]) / math.log(2)


class ExactRunner:
    """Thread-safe front: ``encode``/``decode`` are awaitable from any event loop."""

    def __init__(self, model: ExactLlama, vocab_size: int, max_rows: int = 32, prefill_tokens: int = 8192,
                 threads: int | None = None) -> None:
        self.model = model
        self.vocab_size = vocab_size
        self.max_rows = max(1, max_rows)
        self.prefill_tokens = max(1, prefill_tokens)
        self.threads = threads
        self._encodes: deque[_EncodeJob] = deque()
        self._decodes: deque[_DecodeJob] = deque()
        self._wake = threading.Condition()
        self._closed = False
        self._running = 0
        self._thread = threading.Thread(target=self._run, name="cascade-exact-codec", daemon=True)
        self._thread.start()

    # -- front ------------------------------------------------------------------------------------
    async def encode(self, prompt: Sequence[int], lanes: Sequence[Sequence[int]], top_k: int,
                     precision_bits: int) -> EncodedSegment:
        job = _EncodeJob(list(prompt), [list(lane) for lane in lanes], top_k, precision_bits)
        self._enqueue(job, self._encodes)
        return await self._wait(job, job.future)

    async def decode(self, prompt: Sequence[int], lengths: Sequence[int], payload: bytes, top_k: int,
                     precision_bits: int) -> list[list[int]]:
        if not lengths:
            return []
        job = _DecodeJob(list(prompt), list(lengths), payload, top_k, precision_bits)
        self._enqueue(job, self._decodes)
        return await self._wait(job, job.future)

    def _enqueue(self, job: Any, queue: deque[Any]) -> None:
        with self._wake:
            if self._closed:
                raise RunnerClosedError("the codec runner is shut down")
            queue.append(job)
            self._wake.notify()

    async def _wait(self, job: _EncodeJob | _DecodeJob, future: Future[T]) -> T:
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if isinstance(job, _DecodeJob):  # a running job cannot be cancelled through its future: the worker
                job.cancelled = True  # drops the job's rows at its next step
            job.future.cancel()
            raise

    def live_jobs(self) -> int:
        """Jobs queued or running (the leak checks expect 0 on an idle service)."""
        with self._wake:
            return len(self._encodes) + len(self._decodes) + self._running

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(timeout=30)

    # -- worker -----------------------------------------------------------------------------------
    def _run(self) -> None:
        if self.threads:
            torch.set_num_threads(self.threads)
        while True:
            with self._wake:
                while not self._closed and not self._encodes and not self._decodes:
                    self._wake.wait()
                if self._closed:
                    closed = RunnerClosedError("the codec runner is shut down")
                    futures: list[Future[Any]] = [j.future for j in self._encodes]
                    futures += [j.future for j in self._decodes]
                    for future in futures:
                        if not future.done():
                            future.set_exception(closed)
                    return
            try:
                if self._decodes:
                    self._decode_cohort()
                else:
                    self._encode_batch()
            except Exception:  # a bug must fail the jobs, never kill the worker silently
                logger.exception("codec runner failed")

    def _started(self, jobs: Sequence[_EncodeJob | _DecodeJob], delta: int) -> None:
        with self._wake:
            self._running += delta * len(jobs)

    def _take_encodes(self) -> list[_EncodeJob]:
        jobs: list[_EncodeJob] = []
        budget = self.prefill_tokens
        with self._wake:
            while self._encodes:
                job = self._encodes[0]
                cost = sum(len(job.prompt) + len(lane) for lane in job.lanes)
                if jobs and cost > budget:
                    break
                self._encodes.popleft()
                if job.future.set_running_or_notify_cancel():
                    jobs.append(job)
                    budget -= cost
        return jobs

    def _encode_batch(self) -> None:
        jobs = self._take_encodes()

        def encode() -> None:
            for job, result in zip(jobs, self._encode(jobs), strict=True):
                job.future.set_result(result)

        self._run_jobs(jobs, encode)

    def _run_jobs(self, jobs: Sequence[_EncodeJob | _DecodeJob], work: Callable[[], None]) -> None:
        """Run ``work`` on taken jobs (it answers them): a failure fails every job not yet answered,
        a job still unanswered afterwards was cancelled, and the live-job count covers the run."""
        if not jobs:
            return
        self._started(jobs, 1)
        try:
            work()
        except Exception as exc:
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(exc)
            raise
        finally:
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(RunnerClosedError("the request was cancelled"))
            self._started(jobs, -1)

    def _encode(self, jobs: list[_EncodeJob]) -> list[EncodedSegment]:
        """Every lane of every job through packed prefill passes of at most ``prefill_tokens`` tokens."""
        lanes = [(job, lane) for job in jobs for lane in job.lanes]
        columns: list[tuple[list[int], list[int], list[int], list[float]]] = []
        chunk: list[tuple[_EncodeJob, list[int]]] = []
        size = 0
        for job, lane in lanes:
            if chunk and size + len(job.prompt) + len(lane) > self.prefill_tokens:
                columns += self._lane_symbols(chunk)
                chunk, size = [], 0
            chunk.append((job, lane))
            size += len(job.prompt) + len(lane)
        if chunk:
            columns += self._lane_symbols(chunk)
        results, index = [], 0
        for job in jobs:
            mine = columns[index:index + len(job.lanes)]
            index += len(job.lanes)
            symbols = [LaneSymbols(low, freq, rank, self.vocab_size - job.top_k) for low, freq, rank, _ in mine]
            results.append(EncodedSegment(encode_lanes(symbols, job.precision_bits), sum(len(x) for x in job.lanes),
                                          sum(sum(bits) for *_, bits in mine)))
        return results

    def _lane_symbols(self, lanes: list[tuple[_EncodeJob, list[int]]]
                      ) -> list[tuple[list[int], list[int], list[int], list[float]]]:
        """One prefill pass: per lane, each token's (low, freq, fallback rank, ideal bits)."""
        sequences = [job.prompt + lane[:-1] for job, lane in lanes]
        hidden = self.model.prefill(sequences)
        starts = np.cumsum([0] + [len(s) for s in sequences[:-1]])
        picks = np.concatenate([start + len(job.prompt) - 1 + np.arange(len(lane))
                                for start, (job, lane) in zip(starts, lanes, strict=True)])
        hidden = hidden[torch.from_numpy(picks)]
        wanted = torch.tensor([t for _, lane in lanes for t in lane], dtype=torch.int64)
        row_lane = np.repeat(np.arange(len(lanes)), [len(lane) for _, lane in lanes])
        row_settings = [(lanes[i][0].top_k, lanes[i][0].precision_bits) for i in row_lane]
        low_all = torch.zeros(hidden.shape[0], dtype=torch.int64)
        freq_all = torch.zeros_like(low_all)
        rank_all = torch.zeros_like(low_all)
        bits_all = torch.zeros(hidden.shape[0], dtype=torch.float64)
        for a in range(0, hidden.shape[0], _LOGIT_ROWS):
            logits = self.model.logits(hidden[a:a + _LOGIT_ROWS])
            tokens = wanted[a:a + _LOGIT_ROWS]
            bits_all[a:a + tokens.shape[0]] = ideal_bits(logits, tokens)
            here = row_settings[a:a + _LOGIT_ROWS]
            for top_k, precision in set(here):
                rows = torch.from_numpy(np.flatnonzero([x == (top_k, precision) for x in here]))
                ids, cdf = frequency_tables(logits[rows], top_k, precision)
                low, freq, rank = token_intervals(ids, cdf, tokens[rows], self.vocab_size)
                low_all[rows + a], freq_all[rows + a], rank_all[rows + a] = low, freq, rank
        out, start = [], 0
        lows, freqs, ranks, ideals = low_all.tolist(), freq_all.tolist(), rank_all.tolist(), bits_all.tolist()
        for _, lane in lanes:
            end = start + len(lane)
            out.append((lows[start:end], freqs[start:end], ranks[start:end], ideals[start:end]))
            start = end
        return out

    def _take_decodes(self) -> list[_DecodeJob]:
        jobs: list[_DecodeJob] = []
        rows = 0
        with self._wake:
            while self._decodes and (not jobs or rows + len(self._decodes[0].lengths) <= self.max_rows):
                job = self._decodes.popleft()
                if job.future.set_running_or_notify_cancel():
                    rows += len(job.lengths)
                    jobs.append(job)
        return jobs

    def _decode_cohort(self) -> None:
        jobs = self._take_decodes()
        self._run_jobs(jobs, lambda: self._decode(jobs))

    def _decode(self, jobs: list[_DecodeJob]) -> None:
        model = self.model
        c = model.config
        rows = sum(len(job.lengths) for job in jobs)
        longest = max(len(job.prompt) + max(job.lengths, default=0) for job in jobs)
        cache = KVCache.allocate(rows, longest, c.num_layers, c.num_kv_heads, c.head_dim)
        row_jobs: list[tuple[_DecodeJob, int]] = []
        for job in jobs:
            job.coder = LaneDecoder(job.payload, job.precision_bits, self.vocab_size - job.top_k)
            job.decoded = [[] for _ in job.lengths]
            row_jobs += [(job, lane) for lane in range(len(job.lengths))]
        hidden = model.prefill([job.prompt for job, _ in row_jobs], cache, list(range(rows)))
        ends = np.cumsum([len(job.prompt) for job, _ in row_jobs]) - 1
        hidden = hidden[torch.from_numpy(ends)]
        while row_jobs:
            tokens = self._pick(jobs, row_jobs, model.logits(hidden))
            for job in jobs:
                if not job.future.done() and all(len(d) == n for d, n in zip(job.decoded, job.lengths, strict=True)):
                    job.future.set_result(job.decoded)
            keep = [i for i, (job, lane) in enumerate(row_jobs)
                    if not job.future.done() and not job.cancelled and len(job.decoded[lane]) < job.lengths[lane]]
            if len(keep) < len(row_jobs):
                if not keep:
                    break
                index = torch.tensor(keep)
                cache.keep(index)
                tokens = tokens[index]
                row_jobs = [row_jobs[i] for i in keep]
            hidden = model.step(tokens, cache)
            if self._encodes:
                self._encode_batch()

    def _pick(self, jobs: list[_DecodeJob], row_jobs: list[tuple[_DecodeJob, int]], logits: torch.Tensor
              ) -> torch.Tensor:
        """Each row's next token from its segment's stream, lanes in order (``encode_lanes``'s order)."""
        picked = torch.zeros(len(row_jobs), dtype=torch.int64)
        by_job: dict[int, list[int]] = {}
        for i, (job, _) in enumerate(row_jobs):
            by_job.setdefault(id(job), []).append(i)
        for job in jobs:
            indices = by_job.get(id(job))
            if not indices or job.future.done() or job.cancelled:
                continue
            ids, cdf = frequency_tables(logits[indices], job.top_k, job.precision_bits)
            ids_np, cdf_np = ids.numpy(), cdf.numpy()
            assert job.coder is not None
            for j, i in enumerate(indices):
                lane = row_jobs[i][1]
                target = job.coder.target()
                symbol = min(max(int(np.searchsorted(cdf_np[j], target, side="right")) - 1, 0), job.top_k)
                job.coder.consume(int(cdf_np[j, symbol]), int(cdf_np[j, symbol + 1] - cdf_np[j, symbol]))
                if symbol < job.top_k:
                    token = int(ids_np[j, symbol])
                else:
                    token = rank_to_token(ids_np[j], job.coder.fallback_rank())
                job.decoded[lane].append(token)
                picked[i] = token
        return picked
