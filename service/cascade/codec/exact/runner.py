"""The codec role's batched runner: one worker thread drives the exact model for every request.

The worker loops in *steps*. Each step it

1. admits waiting decompression segments into the running cohort (continuous batching): a segment's
   prompt is prefilled once and its keys and values copied into one KV-cache row per lane
   (``cohort``); rows of segments admitted earlier keep going;
2. takes one decode step for every row: integer logits, then each segment's range decoder picks its
   lanes' tokens (the model proposes the distribution, the coder picks the token); a row leaves the
   moment its lane is complete, a segment whose decoder fails (e.g. it read past its payload) leaves
   with all its rows at once and only its own future gets the error;
3. runs at most one compression *chunk*: prefill of whole lanes of waiting segments, at most
   ``prefill_tokens`` tokens (at least one lane), so compression interleaves with decoding — while
   rows decode, only on credit (``_may_prefill``): over any decode steps that fed ``R`` rows in
   all, at most ``R · interleave_tokens + prefill_tokens`` tokens of prefill plus one chunk run
   between them, the wall-clock bound of a waiting decode step in tokens of work ahead of it (a
   1 KB decompress, one row, beside a large compression waits behind ~16 tokens of prefill per
   step, not ~1,024; a full cohort of 32 rows lets 512 through, so compression keeps its pace
   beside heavy decoding).

**Speculation.** Each decode step feeds every row its pending token and a draft of the tokens after
it (``drafts``: n-grams of the context and the segment's decoded lanes) in one exact multi-position
pass; a segment's stream then decodes lane by lane, in its fixed interleaved order, while each
lane's draft matched what was decoded, so a step advances a lane by one token or more and never
decodes a token from anything but the distribution the encoder used.

**Fairness.** Every job carries a request key (``request=``; one per call unless given). Admission
and chunk filling serve requests least-recently-served first, one segment (decoding) or one lane
(compression) per turn, and admission never skips the request whose turn it is: when its segment
does not fit (rows or KV budget), nothing else is admitted until it does. Hence, with ``P`` the
longest lane any running row still has to decode (≤ the model's positions):

- a request's first decode segment may exceed ``max_rows`` (a throughput knob; the KV budget is the
  memory limit), so a new request's first segment joins at the next step whenever the budget has
  room, however many segments other requests have queued (tested: ``test_exact_runner``);
- otherwise a request whose turn it is gets its segment started within ``P + 1`` steps of being
  queued (running rows only leave; the step under way when it arrives counts as one);
- with ``R`` requests holding compression work, every one of them gets a lane into a chunk at least
  once every ``R`` steps, so a new request's first segment of ``L`` lanes is coded within
  ``R·L + 1`` steps.

The bounds hold per request key: callers that pass none make every segment its own request, and a
new segment then also waits for the segments queued before it.

**Memory.** A decode segment of ``n`` lanes needs ``n`` rows of ``len(prompt) + longest lane − 1``
positions. It is admitted only while ``rows × longest need × bytes_per_row_position`` of the whole
cohort (the cache's rectangle) stays within ``kv_budget_bytes``; one that could never fit is refused
before any work (``SegmentTooLargeError``, a 400). The cache grows with the positions rows have
reached, not with what a container declares.

Because the model's integers do not depend on batch composition (see ``model``), any grouping,
arrival order or interleaving gives the same bits.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import numpy as np
import numpy.typing as npt
import torch

from cascade.codec.container import ContainerError
from cascade.codec.exact import root
from cascade.codec.exact.cache import bytes_per_row_position
from cascade.codec.exact.cohort import Cohort
from cascade.codec.exact.drafts import DraftSourceFactory, SegmentDrafts, ngram_source
from cascade.codec.exact.frequencies import ESCAPE_BITS, escape_tables, frequency_tables, rank_to_token, token_intervals
from cascade.codec.exact.model import LOGIT_FRACTION_BITS, ExactLlama
from cascade.codec.lanes import LaneDecoder, LaneSymbols, encode_lanes

logger = logging.getLogger("cascade.codec")
T = TypeVar("T")
_LOGIT_ELEMENTS = 1 << 20
_EVENTS = 4096
P = ParamSpec("P")


def single_threaded(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args)`` with one torch thread, for codec work outside the runner's worker (model loading,
    the known-answer check). Measured: once a second thread had run torch's parallel kernels, every
    parallel op of the worker got ~1.5× slower (a decode step of pycoder-23m at 32 rows: 22 → 38 ms);
    single-threaded work elsewhere leaves the worker the only parallel user."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn(*args, **kwargs)
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class EncodedSegment:
    payload: bytes
    tokens: int
    ideal_bits: float


class RunnerClosedError(RuntimeError):
    """The runner was shut down while a job waited."""


class SegmentTooLargeError(ContainerError):
    """A segment whose KV cache could never fit the runner's memory budget (refused before any work)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="container_too_large")


@dataclass
class RunnerStats:
    """Counters of the worker (read from any thread; figures for benchmarks and tests).

    ``steps`` counts worker iterations (each: admissions, one decode step, at most one compression
    chunk). ``events`` holds recent ``(kind, request, queued_step, step)``: ``"decode-start"`` when a
    decode segment joins the cohort, ``"decode-done"`` when its last lane completes, ``"encode-done"``
    when a compression segment is coded."""

    steps: int = 0
    decode_steps: int = 0
    encode_chunks: int = 0
    model_seconds: float = 0.0
    pick_seconds: float = 0.0
    encode_model_seconds: float = 0.0
    encode_coder_seconds: float = 0.0
    peak_kv_bytes: int = 0
    decoded_tokens: int = 0
    row_steps: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    interleaved_prefill_tokens: int = 0
    events: deque[tuple[str, object, int, int]] = field(default_factory=lambda: deque(maxlen=_EVENTS))

    def tokens_per_row_step(self) -> float:
        """Mean tokens a decoding lane advanced per step (1.0 without speculation)."""
        return self.decoded_tokens / self.row_steps if self.row_steps else 0.0

    def pick_share(self) -> float:
        """Share of decode-step time spent picking tokens (frequency tables + range decoder)."""
        total = self.model_seconds + self.pick_seconds
        return self.pick_seconds / total if total else 0.0


@dataclass(eq=False)
class _Request:
    key: object
    arrival: int
    encodes: deque[_EncodeJob] = field(default_factory=deque)
    decodes: deque[_DecodeJob] = field(default_factory=deque)
    encode_turn: int = -1
    decode_turn: int = -1
    live: int = 0


@dataclass(eq=False)
class _Job:
    request: _Request
    prompt: list[int]
    top_k: int
    precision_bits: int
    weighted_escapes: bool
    queued_step: int
    future: Future[Any] = field(default_factory=Future)
    cancelled: bool = False
    done: bool = False


@dataclass(eq=False)
class _EncodeJob(_Job):
    lanes: list[list[int]] = field(default_factory=list)
    columns: list[tuple[list[int], list[int], list[int], list[int], list[float]] | None] = field(
        default_factory=list)
    next_lane: int = 0
    pending: int = 0


@dataclass(eq=False)
class _DecodeJob(_Job):
    lengths: list[int] = field(default_factory=list)
    payload: bytes = b""
    need: int = 0
    rows: int = 0
    decoded: list[list[int]] = field(default_factory=list)
    lanes_left: int = 0
    coder: LaneDecoder | None = None
    next_lane: int = 0
    drafts: SegmentDrafts | None = None


def ideal_bits(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Per row, the exact model's own code length for its token (statistics only; not in the coding path:
    float32 halves the passes over the vocabulary and stays within ~1e-6 bits per token)."""
    z = logits.to(torch.float32) * 2.0**-LOGIT_FRACTION_BITS
    bits = (torch.logsumexp(z, dim=1) - z.gather(1, tokens[:, None])[:, 0]) / math.log(2)
    return bits.to(torch.float64)


def escaped_token(coder: LaneDecoder, logits: torch.Tensor, row_ids: npt.NDArray[np.int64], weighted: bool) -> int:
    """The token after an escape, for the row of ``logits`` (1, vocab) whose top-k ids are ``row_ids``:
    bisected in its ``escape_tables`` (container version 4), or from its uniform rank (version 3)."""
    if not weighted:
        rank = coder.fallback_target()
        coder.consume_fallback(rank, 1)
        return rank_to_token(row_ids, rank)
    cdf = escape_tables(logits, torch.from_numpy(row_ids).to(logits.device)[None])[0].cpu().numpy()
    token = int(np.searchsorted(cdf, coder.fallback_target(), side="right")) - 1
    low = int(cdf[token])
    coder.consume_fallback(low, int(cdf[token + 1]) - low)
    return token


class _Distributions:
    """A decode pass's coding tables per query row, built on demand: ``build`` computes the integer logits
    and frequency tables of some rows (grouped by coding settings); ``where[q]`` is row ``q``'s group's
    flat ids and CDF (memoryviews: Python ints per item, no per-row copies) and where its row starts."""

    def __init__(self, model: ExactLlama, hidden: torch.Tensor, settings: list[tuple[int, int]]) -> None:
        self.model = model
        self.hidden = hidden
        self.settings = settings
        self.where: dict[int, tuple[memoryview, memoryview, int, int]] = {}
        self._logits: dict[int, tuple[torch.Tensor, int]] = {}

    def build(self, queries: list[int]) -> None:
        device = self.hidden.device
        logits = self.model.logits(self.hidden[torch.tensor(queries, dtype=torch.int64, device=device)])
        groups: dict[tuple[int, int], list[int]] = {}
        for j, q in enumerate(queries):
            groups.setdefault(self.settings[q], []).append(j)
            self._logits[q] = (logits, j)
        for (top_k, precision), rows in groups.items():
            ids, cdf = frequency_tables(logits[rows], top_k, precision)
            flat_ids = np.ascontiguousarray(ids.cpu().numpy()).reshape(-1).data
            flat_cdf = np.ascontiguousarray(cdf.cpu().numpy()).reshape(-1).data
            for k, j in enumerate(rows):
                self.where[queries[j]] = (flat_ids, flat_cdf, k * top_k, k * (top_k + 2))

    def logits_row(self, q: int) -> torch.Tensor:
        """Row ``q``'s integer logits as ``(1, vocab)`` (for an escaped token's table)."""
        logits, j = self._logits[q]
        return logits[j:j + 1]


class ExactRunner:
    """Thread-safe front: ``encode``/``decode`` are awaitable from any event loop.

    ``max_rows``: KV rows decoded together (a segment with more lanes runs alone);
    ``prefill_tokens``: tokens per compression chunk; ``threads``: torch threads of the worker (None:
    the constructing thread's count); ``kv_budget_bytes``: the decode cache's budget (None: unbounded);
    ``max_draft``: the longest draft a lane verifies per step (0: no speculation, one token per step);
    ``draft_source``: makes each decode segment's drafter (tests pass adversarial ones);
    ``pass_positions``: drafts fill a decode pass up to this many positions (rows + draft tokens);
    ``machine_root``: the worker computes with this machine's torch square root (``root.machine``), as
    earlier releases did — the pipeline's second reading of a segment that failed its checksum;
    ``interleave_tokens``: compression prefill tokens per decoded row of a step while rows decode
    (``_may_prefill``); ``cuda_graphs``: on a GPU, decode passes replay as CUDA graphs (``graphs``)."""

    def __init__(self, model: ExactLlama, vocab_size: int, max_rows: int = 32, prefill_tokens: int = 8192,
                 threads: int | None = None, *, kv_budget_bytes: int | None = None, max_draft: int = 16,
                 draft_source: DraftSourceFactory = ngram_source, interleave_tokens: int = 16,
                 pass_positions: int = 32, machine_root: bool = False, cuda_graphs: bool = True) -> None:
        self.model = model
        self.machine_root = machine_root
        self.cuda_graphs = cuda_graphs and not machine_root and model.device.type == "cuda"
        self.max_draft = max(0, max_draft)
        self.pass_positions = pass_positions
        self.interleave_tokens = max(1, interleave_tokens)
        self._prefill_credit = 0
        self.draft_source = draft_source
        self.vocab_size = vocab_size
        self.max_rows = max(1, max_rows)
        self.prefill_tokens = max(1, prefill_tokens)
        # Fixed here, not read lazily by the worker: ``single_threaded`` work may be lowering the count
        # for its own thread at the moment the worker first touches torch.
        self.threads = threads or torch.get_num_threads()
        self.kv_budget_bytes = kv_budget_bytes
        self.row_position_bytes = bytes_per_row_position(model.config, model.cache_dtype)
        self.stats = RunnerStats()
        self._requests: dict[object, _Request] = {}
        self._arrivals = itertools.count()
        self._turns = itertools.count()
        self._cohort = Cohort(model, self.cuda_graphs)
        self._live = 0
        self._wake = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="cascade-exact-codec", daemon=True)
        self._thread.start()

    # -- front ------------------------------------------------------------------------------------
    async def encode(self, prompt: Sequence[int], lanes: Sequence[Sequence[int]], top_k: int,
                     precision_bits: int, request: object | None = None, *, weighted_escapes: bool = True
                     ) -> EncodedSegment:
        """Code ``lanes`` (each conditioned on ``prompt``) into one interleaved stream. An escaped token is
        coded under ``escape_tables`` (``weighted_escapes``: container version 4) or as its uniform rank
        among the ids outside the top-k (version 3 and replay objects)."""
        tokens = [list(lane) for lane in lanes]
        self._check(prompt, top_k, precision_bits, [t for lane in tokens for t in lane])
        if any(not lane for lane in tokens):
            raise ValueError("a lane must hold at least one token")
        if any(len(prompt) + len(lane) - 1 > self.model.max_positions for lane in tokens):
            raise ValueError(f"prompt + lane exceed the model's {self.model.max_positions} positions")
        if not tokens:
            return EncodedSegment(encode_lanes([], precision_bits), 0, 0.0)
        job = _EncodeJob(self._request(request), list(prompt), top_k, precision_bits, weighted_escapes, 0,
                         lanes=tokens, columns=[None] * len(tokens), pending=len(tokens))
        self._enqueue(job)
        result: EncodedSegment = await self._wait(job)
        return result

    async def decode(self, prompt: Sequence[int], lengths: Sequence[int], payload: bytes, top_k: int,
                     precision_bits: int, request: object | None = None, *, weighted_escapes: bool = True
                     ) -> list[list[int]]:
        """The lanes' tokens from ``payload`` (lane ``i`` holds ``lengths[i]`` tokens), escapes read as
        ``encode`` wrote them."""
        lengths = [int(n) for n in lengths]
        self._check(prompt, top_k, precision_bits, [])
        if any(n < 0 for n in lengths):
            raise ValueError("lane lengths must be ≥ 0")
        rows = sum(1 for n in lengths if n)
        if not rows:
            return [[] for _ in lengths]
        need = len(prompt) + max(lengths) - 1
        if need > self.model.max_positions:
            raise ValueError(f"prompt + lane exceed the model's {self.model.max_positions} positions")
        if self.kv_budget_bytes is not None and rows * need * self.row_position_bytes > self.kv_budget_bytes:
            raise SegmentTooLargeError(
                f"a segment of {rows} lanes × {need} positions needs "
                f"{rows * need * self.row_position_bytes / 2**20:.0f} MiB of decode cache, more than this "
                f"server's budget of {self.kv_budget_bytes / 2**20:.0f} MiB (codec_kv_budget_mib)")
        job = _DecodeJob(self._request(request), list(prompt), top_k, precision_bits, weighted_escapes, 0,
                         lengths=lengths, payload=bytes(payload), need=need, rows=rows)
        self._enqueue(job)
        result: list[list[int]] = await self._wait(job)
        return result

    def max_segment_rows(self, positions: int) -> int:
        """The most lanes of ``positions`` positions each that one segment may have to be decodable here."""
        if self.kv_budget_bytes is None:
            return 1 << 30
        return self.kv_budget_bytes // max(1, positions * self.row_position_bytes)

    def _check(self, prompt: Sequence[int], top_k: int, precision_bits: int, tokens: list[int]) -> None:
        if not prompt:
            raise ValueError("the prompt must hold at least one token")
        if not 1 <= top_k < self.vocab_size:
            raise ValueError(f"top_k must lie in [1, {self.vocab_size})")
        if not 1 <= precision_bits <= 32 or top_k + 1 > 1 << precision_bits:
            raise ValueError(f"{top_k + 1} symbols do not fit {precision_bits}-bit frequencies")
        ids = [*prompt, *tokens]
        if min(ids) < 0 or max(ids) >= self.model.config.vocab_size:
            raise ValueError("token ids must lie in the model's vocabulary")

    def _request(self, key: object | None) -> _Request:
        """Called unlocked: only the key is looked up later (``_enqueue``)."""
        return _Request(object() if key is None else key, -1)

    def _enqueue(self, job: _EncodeJob | _DecodeJob) -> None:
        with self._wake:
            if self._closed:
                raise RunnerClosedError("the codec runner is shut down")
            request = self._requests.get(job.request.key)
            if request is None:
                request = job.request
                request.arrival = next(self._arrivals)
                self._requests[request.key] = request
            job.request = request
            job.queued_step = self.stats.steps
            if isinstance(job, _EncodeJob):
                request.encodes.append(job)
            else:
                request.decodes.append(job)
            request.live += 1
            self._live += 1
            self._wake.notify()

    async def _wait(self, job: _Job) -> Any:
        try:
            return await asyncio.wrap_future(job.future)
        except asyncio.CancelledError:
            job.cancelled = True  # a running job cannot be cancelled through its future: the worker drops it
            job.future.cancel()
            with self._wake:
                self._wake.notify()
            raise

    def live_jobs(self) -> int:
        """Jobs queued or running (the leak checks expect 0 on an idle service)."""
        with self._wake:
            return self._live

    def live_rows(self) -> int:
        """KV rows the decode cohort holds now."""
        return len(self._cohort)

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(timeout=30)

    # -- bookkeeping (worker) ---------------------------------------------------------------------
    def _finish(self, job: _Job, result: Any = None, error: BaseException | None = None) -> None:
        """Answer ``job`` once (a cancelled future just ends), release its request's share."""
        if job.done:
            return
        job.done = True
        with self._wake:
            self._live -= 1
            request = job.request
            request.live -= 1
            if request.live == 0 and self._requests.get(request.key) is request:
                del self._requests[request.key]
        if not job.future.done():
            if error is not None:
                job.future.set_exception(error)
            else:
                job.future.set_result(result)

    def _purge_cancelled(self) -> list[_Job]:
        """Queued jobs whose callers went away (under the lock)."""
        gone: list[_Job] = []
        for request in self._requests.values():
            for queue in (request.encodes, request.decodes):
                dead = [job for job in queue if job.cancelled or job.future.cancelled()]
                for job in dead:
                    queue.remove(job)  # type: ignore[arg-type]
                gone += dead
        return gone

    def _has_work(self) -> bool:
        return len(self._cohort) > 0 or any(r.encodes or r.decodes for r in self._requests.values())

    # -- scheduling (worker, under the lock) ------------------------------------------------------
    def _admit(self) -> list[_DecodeJob]:
        """Decode segments joining the cohort this step, least-recently-served request first; stops
        at the first that does not fit, so the request whose turn it is never waits on later ones. A
        request's first segment is held back by the KV budget only, not by ``max_rows``."""
        admitted: list[_DecodeJob] = []
        rows, need = len(self._cohort), self._cohort.longest_need()
        while True:
            waiting = [r for r in self._requests.values() if r.decodes]
            if not waiting:
                return admitted
            request = min(waiting, key=lambda r: (r.decode_turn, r.arrival))
            job = request.decodes[0]
            if rows and rows + job.rows > self.max_rows and request.decode_turn >= 0:
                return admitted
            if rows and self.kv_budget_bytes is not None and \
                    (rows + job.rows) * max(need, job.need) * self.row_position_bytes > self.kv_budget_bytes:
                return admitted
            request.decodes.popleft()
            request.decode_turn = next(self._turns)
            if not job.future.set_running_or_notify_cancel():
                job.cancelled = True
                admitted.append(job)  # answered (dropped) by the worker outside the lock
                continue
            admitted.append(job)
            rows += job.rows
            need = max(need, job.need)

    def _take_chunk(self) -> list[tuple[_EncodeJob, int]]:
        """Lanes for one compression chunk, one lane per turn, least-recently-served request first."""
        chunk: list[tuple[_EncodeJob, int]] = []
        size = 0
        while True:
            waiting = [r for r in self._requests.values() if r.encodes]
            if not waiting:
                return chunk
            request = min(waiting, key=lambda r: (r.encode_turn, r.arrival))
            job = request.encodes[0]
            cost = len(job.prompt) + len(job.lanes[job.next_lane])
            if chunk and size + cost > self.prefill_tokens:
                return chunk
            if job.next_lane == 0 and not job.future.set_running_or_notify_cancel():
                request.encodes.popleft()
                job.cancelled = True
                chunk.append((job, -1))  # dropped by the worker outside the lock
                continue
            chunk.append((job, job.next_lane))
            size += cost
            job.next_lane += 1
            if job.next_lane == len(job.lanes):
                request.encodes.popleft()
            request.encode_turn = next(self._turns)

    def _may_prefill(self, admitted: list[_DecodeJob]) -> bool:
        """Whether a compression chunk runs this step (wall-clock fairness): while rows decode, chunks
        run on credit — each decode step earns ``interleave_tokens`` per row it fed, each chunk spends
        its tokens — so over decode steps that fed ``R`` rows at most ``R · interleave_tokens`` tokens
        of compression prefill plus one chunk (≤ ``prefill_tokens``, or one lane) run between them.
        Without decoding rows, chunks run back to back."""
        if not len(self._cohort) and not admitted:
            self._prefill_credit = 0
            return True
        return self._prefill_credit >= 0

    # -- worker -----------------------------------------------------------------------------------
    def _run(self) -> None:
        torch.set_num_threads(self.threads)
        with root.machine() if self.machine_root else contextlib.nullcontext():
            self._loop()
        self._shutdown()

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._closed and not self._has_work():
                    self._wake.wait()
                if self._closed:
                    break
                gone = self._purge_cancelled()
                admitted = self._admit()
                chunk = self._take_chunk() if self._may_prefill(admitted) else []
            for job in gone:
                self._finish(job, error=RunnerClosedError("the request was cancelled"))
            try:
                self._step(admitted, chunk)
            except Exception as exc:  # a bug must fail the jobs, never kill the worker silently
                logger.exception("codec runner failed")
                for job in {*self._cohort.owners, *admitted, *(job for job, _ in chunk)}:
                    self._finish(job, error=exc)
                self._cohort = Cohort(self.model, self.cuda_graphs)
            with self._wake:
                self.stats.steps += 1

    def _shutdown(self) -> None:
        closed = RunnerClosedError("the codec runner is shut down")
        with self._wake:
            queued: list[_Job] = [job for r in self._requests.values() for job in (*r.encodes, *r.decodes)]
        for job in {*queued, *self._cohort.owners}:
            self._finish(job, error=closed)
        self._cohort = Cohort(self.model, self.cuda_graphs)

    def _step(self, admitted: list[_DecodeJob], chunk: list[tuple[_EncodeJob, int]]) -> None:
        joining = []
        for job in admitted:
            if job.cancelled:
                self._finish(job, error=RunnerClosedError("the request was cancelled"))
                continue
            try:
                job.coder = LaneDecoder(job.payload, job.precision_bits, self._fallback_total(job))
            except Exception as exc:
                self._finish(job, error=exc)
                continue
            job.decoded = [[] for _ in job.lengths]
            job.lanes_left = job.rows
            if self.max_draft:
                job.drafts = SegmentDrafts(self.draft_source(), job.prompt, len(job.lengths), self.max_draft)
            lanes = [lane for lane, n in enumerate(job.lengths) if n]
            joining.append((job, job.prompt, lanes, job.need))
            self.stats.events.append(("decode-start", job.request.key, job.queued_step, self.stats.steps))
        if joining:
            start = time.perf_counter()
            self._cohort.join(joining)
            self.stats.model_seconds += time.perf_counter() - start
        if len(self._cohort):
            self._decode_step()
        if chunk:
            self._encode_chunk(chunk)

    def _decode_step(self) -> None:
        """Every row feeds its pending token and its lane's draft in one pass; each segment's stream then
        decodes as far as the pass's distributions reach (``_pick``); rows keep only decoded positions."""
        cohort = self._cohort
        for job in {job for job in cohort.owners if job.cancelled and not job.done}:
            self._finish(job, error=RunnerClosedError("the request was cancelled"))
        cohort.keep([i for i, job in enumerate(cohort.owners) if not job.done])
        if not len(cohort):
            return
        self.stats.peak_kv_bytes = max(self.stats.peak_kv_bytes, cohort.nbytes())
        start = time.perf_counter()
        segments = self._segments()
        drafts = self._drafts(segments)
        hidden, starts = cohort.step(drafts)
        picked = time.perf_counter()
        # counted before any job is answered (a caller may read them as soon as its future is done)
        self.stats.decode_steps += 1
        self._prefill_credit = min(self.prefill_tokens, self._prefill_credit + self.interleave_tokens * len(drafts))
        self.stats.row_steps += len(drafts)
        self.stats.drafted_tokens += sum(len(d) for d in drafts)
        decoded, keep = self._pick(hidden, starts, drafts, segments)
        model_start = time.perf_counter()
        cohort.advance([len(tokens) for tokens in decoded],
                       [tokens[-1] if tokens else pending for tokens, pending in zip(decoded, cohort.pending,
                                                                                     strict=True)])
        cohort.keep(keep)
        end = time.perf_counter()
        self.stats.model_seconds += (picked - start) + (end - model_start)
        self.stats.pick_seconds += model_start - picked
        self.stats.peak_kv_bytes = max(self.stats.peak_kv_bytes, cohort.nbytes())

    def _segments(self) -> dict[_DecodeJob, list[int]]:
        """The cohort's rows of each decode segment (a segment's rows in lane order)."""
        segments: dict[_DecodeJob, list[int]] = {}
        for i, job in enumerate(self._cohort.owners):
            segments.setdefault(job, []).append(i)
        return segments

    def _drafts(self, segments: dict[_DecodeJob, list[int]]) -> list[list[int]]:
        """Each row's draft (``SegmentDrafts.propose``, a segment's lanes together): never past the lane's
        second-to-last token (its last is never fed), and all drafts of a pass together at most
        ``pass_positions`` minus the rows: a full batch is already as fast per token as the hardware
        goes, so drafts only fill a small one (decoding at 32 rows runs as without speculation)."""
        owners, lanes = self._cohort.owners, self._cohort.lanes
        room = self.pass_positions - len(owners)
        out: list[list[int]] = [[] for _ in owners]
        for job, rows in segments.items():
            if job.drafts is None or room <= 0:
                continue
            decoded = [job.decoded[lanes[i]] for i in rows]
            left = [job.lengths[lanes[i]] - len(done) for i, done in zip(rows, decoded, strict=True)]
            drafts = job.drafts.propose([lanes[i] for i in rows], decoded, left, room, len(owners))
            for i, draft in zip(rows, drafts, strict=True):
                out[i] = draft
                room -= len(draft)
        return out

    def _pick(self, hidden: torch.Tensor, starts: list[int], drafts: list[list[int]],
              segments: dict[_DecodeJob, list[int]]) -> tuple[list[list[int]], list[int]]:
        """Each segment's tokens from its stream, in the order ``encode_lanes`` wrote them: lanes in turn,
        from the lane whose symbol is next, each from its next distribution of this pass, while that
        distribution is valid — the row's draft matched every token decoded before it. Returns the
        tokens each row decoded and the rows still running. Logits and frequency tables are built for
        every row's first position at once, and for a row's drafted positions only once the walk reaches
        them (``_Distributions``); the per-token work is the coder and a bisection."""
        owners: list[_DecodeJob] = self._cohort.owners
        lanes = self._cohort.lanes
        n = len(owners)
        settings = [(job.top_k, job.precision_bits) for i, job in enumerate(owners) for _ in range(1 + len(drafts[i]))]
        tables = _Distributions(self.model, hidden, settings)
        tables.build(starts)
        decoded: list[list[int]] = [[] for _ in range(n)]
        for job, rows in segments.items():
            if not job.done:
                self._decode_segment(job, rows, tables, starts, drafts, decoded)
        keep = [i for i, job in enumerate(owners)
                if not job.done and len(job.decoded[lanes[i]]) < job.lengths[lanes[i]]]
        return decoded, keep

    def _decode_segment(self, job: _DecodeJob, rows: list[int], tables: _Distributions, starts: list[int],
                        drafts: list[list[int]], decoded: list[list[int]]) -> None:
        """Walk ``job``'s stream over its rows (lane order) from lane ``job.next_lane``; see ``_pick``."""
        lanes = self._cohort.lanes
        running = list(rows)
        at = next(k for k, r in enumerate(running) if lanes[r] == job.next_lane)
        coder = job.coder
        assert coder is not None
        top_k = job.top_k
        while running:
            r = running[at]
            used = len(decoded[r])
            draft = drafts[r]
            if used > len(draft) or (used and decoded[r][-1] != draft[used - 1]):
                break  # this lane's next distribution was not computed: the stream waits for the next pass
            q = starts[r] + used
            if q not in tables.where:
                tables.build(list(range(q, starts[r] + 1 + len(draft))))
            ids_of, cdf, at_ids, base = tables.where[q]
            try:
                symbol = min(max(bisect.bisect_right(cdf, coder.target(), base, base + top_k + 2) - 1 - base, 0),
                             top_k)
                low = cdf[base + symbol]
                coder.consume(low, cdf[base + symbol + 1] - low)
                if symbol < top_k:
                    token = ids_of[at_ids + symbol]
                else:
                    row_ids = np.asarray(ids_of[at_ids:at_ids + top_k], dtype=np.int64)
                    token = escaped_token(coder, tables.logits_row(q), row_ids, job.weighted_escapes)
            except Exception as exc:  # this segment's stream is bad (e.g. read past its end): it alone fails
                self._finish(job, error=exc)
                return
            decoded[r].append(token)
            self.stats.decoded_tokens += 1
            self.stats.accepted_tokens += used > 0
            lane = lanes[r]
            job.decoded[lane].append(token)
            if len(job.decoded[lane]) < job.lengths[lane]:
                at += 1
            else:
                running.pop(at)
                job.lanes_left -= 1
                if job.lanes_left == 0:
                    self.stats.events.append(("decode-done", job.request.key, job.queued_step, self.stats.steps))
                    self._finish(job, job.decoded)
                    return
            if running:
                at %= len(running)
        job.next_lane = lanes[running[at]]
        if job.drafts is not None:
            for r in rows:
                job.drafts.record(lanes[r], decoded[r])

    def _fallback_total(self, job: _Job) -> int:
        return 1 << ESCAPE_BITS if job.weighted_escapes else self.vocab_size - job.top_k

    def _encode_chunk(self, chunk: list[tuple[_EncodeJob, int]]) -> None:
        live = [(job, lane) for job, lane in chunk if lane >= 0 and not job.cancelled]
        for job in {job for job, lane in chunk if lane < 0 or job.cancelled}:
            self._finish(job, error=RunnerClosedError("the request was cancelled"))
        if not live:
            return
        if len(self._cohort):
            self._prefill_credit -= sum(len(job.prompt) + len(job.lanes[lane]) for job, lane in live)
            self.stats.interleaved_prefill_tokens += sum(len(job.prompt) + len(job.lanes[lane]) for job, lane in live)
        start = time.perf_counter()
        try:
            columns = self._lane_symbols([(job, job.lanes[lane]) for job, lane in live])
        except Exception as exc:
            for job in {job for job, _ in live}:
                self._finish(job, error=exc)
            return
        coded = time.perf_counter()
        finished: list[_EncodeJob] = []
        for (job, lane), column in zip(live, columns, strict=True):
            job.columns[lane] = column
            job.pending -= 1
            if job.pending == 0:
                finished.append(job)
        for job in finished:
            mine = [c for c in job.columns if c is not None]
            total = self._fallback_total(job)
            symbols = [LaneSymbols(low, freq, fallback_low, fallback_freq, total)
                       for low, freq, fallback_low, fallback_freq, _ in mine]
            try:
                result = EncodedSegment(encode_lanes(symbols, job.precision_bits),
                                        sum(len(x) for x in job.lanes), sum(sum(bits) for *_, bits in mine))
            except Exception as exc:
                self._finish(job, error=exc)
                continue
            self.stats.events.append(("encode-done", job.request.key, job.queued_step, self.stats.steps))
            self._finish(job, result)
        self.stats.encode_chunks += 1
        self.stats.encode_model_seconds += coded - start
        self.stats.encode_coder_seconds += time.perf_counter() - coded

    def _lane_symbols(self, lanes: list[tuple[_EncodeJob, list[int]]]
                      ) -> list[tuple[list[int], list[int], list[int], list[int], list[float]]]:
        """One prefill pass: per lane, each token's (low, freq, fallback low (−1: none), fallback freq,
        ideal bits)."""
        sequences = [job.prompt + lane[:-1] for job, lane in lanes]
        hidden = self.model.prefill(sequences)
        starts = np.cumsum([0] + [len(s) for s in sequences[:-1]])
        picks = np.concatenate([start + len(job.prompt) - 1 + np.arange(len(lane))
                                for start, (job, lane) in zip(starts, lanes, strict=True)])
        device = hidden.device
        hidden = hidden[torch.from_numpy(picks).to(device)]
        wanted = torch.tensor([t for _, lane in lanes for t in lane], dtype=torch.int64, device=device)
        row_lane = np.repeat(np.arange(len(lanes)), [len(lane) for _, lane in lanes])
        row_settings = [(lanes[i][0].top_k, lanes[i][0].precision_bits, lanes[i][0].weighted_escapes)
                        for i in row_lane]
        low_all = torch.zeros(hidden.shape[0], dtype=torch.int64, device=device)
        freq_all = torch.zeros_like(low_all)
        fallback_low_all = torch.zeros_like(low_all)
        fallback_freq_all = torch.zeros_like(low_all)
        bits_all = torch.zeros(hidden.shape[0], dtype=torch.float64, device=device)
        # Logits in slices of ~2**20 values: the full-vocabulary passes stay in reused heap memory
        # (a 1,024-row slice of a 49k vocabulary took 3× longer per row, mostly fresh pages).
        block = max(8, _LOGIT_ELEMENTS // self.vocab_size)
        for a in range(0, hidden.shape[0], block):
            logits = self.model.logits(hidden[a:a + block])
            tokens = wanted[a:a + block]
            bits_all[a:a + tokens.shape[0]] = ideal_bits(logits, tokens)
            here = row_settings[a:a + block]
            for top_k, precision, weighted in set(here):
                rows = torch.from_numpy(np.flatnonzero([x == (top_k, precision, weighted) for x in here])).to(device)
                ids, cdf = frequency_tables(logits[rows], top_k, precision)
                low, freq, rank = token_intervals(ids, cdf, tokens[rows], self.vocab_size)
                fallback_low, fallback_freq = rank, torch.ones_like(rank)
                escaped = torch.from_numpy(np.flatnonzero(rank.cpu().numpy() >= 0)).to(device)
                if weighted and escaped.numel():
                    escape_cdf = escape_tables(logits[rows[escaped]], ids[escaped])
                    token = tokens[rows[escaped]][:, None]
                    fallback_low[escaped] = escape_cdf.gather(1, token)[:, 0]
                    fallback_freq[escaped] = escape_cdf.gather(1, token + 1)[:, 0] - fallback_low[escaped]
                low_all[rows + a], freq_all[rows + a] = low, freq
                fallback_low_all[rows + a], fallback_freq_all[rows + a] = fallback_low, fallback_freq
        out, start = [], 0
        lows, freqs, ideals = low_all.tolist(), freq_all.tolist(), bits_all.tolist()
        fallback_lows, fallback_freqs = fallback_low_all.tolist(), fallback_freq_all.tolist()
        for _, lane in lanes:
            end = start + len(lane)
            out.append((lows[start:end], freqs[start:end], fallback_lows[start:end], fallback_freqs[start:end],
                        ideals[start:end]))
            start = end
        return out
