"""The app's one owner of long-lived state: engines, codec and its availability, watchdogs, live
k-CBS searches. Routes reach it through ``api.deps``; nothing else is kept on ``app.state``."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import signal
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from cascade.api.response_store import ResponseStore
from cascade.codec.container import Limits
from cascade.codec.pipeline import CodecPipeline, CodecUnavailableError
from cascade.engine.manager import EngineManager
from cascade.metrics import Metrics
from cascade.settings import Settings

if TYPE_CHECKING:
    from cascade.export.token_table import TokenTable

logger = logging.getLogger("cascade.lifecycle")


class CodecState(StrEnum):
    """Where the codec is; only ``READY`` serves (every other state answers 503 with the reason)."""

    DISABLED = "disabled"
    STARTING = "starting"
    SELF_TEST = "self_test"
    READY = "ready"
    UNSUPPORTED = "unsupported"
    FAILED = "failed"


def _import_grammar_compiler() -> None:
    """Import xgrammar (it compiles JSON schemas in the gateway, ``api.structured``) while the engines
    start: the import takes seconds, which the first request with a schema would otherwise wait."""
    try:
        importlib.import_module("xgrammar")
    except ImportError:  # vLLM installs it; without it a schema is refused when it is compiled
        logger.warning("xgrammar is not installed: JSON schemas cannot be compiled")


@dataclass
class CodecStatus:
    """The codec's state and, when it cannot serve, why."""

    state: CodecState = CodecState.STARTING
    reason: str = "the codec is starting"

    def set(self, state: CodecState, reason: str = "") -> None:
        self.state, self.reason = state, reason
        if state in (CodecState.UNSUPPORTED, CodecState.FAILED):
            logger.error("codec unavailable", extra={"reason": reason})

    def describe(self) -> str:
        """``ok`` or the reason (``/ready``)."""
        return "ok" if self.state is CodecState.READY else self.reason


@dataclass
class Gateway:
    """Everything one running service owns, created by ``create_app`` and started by its lifespan."""

    settings: Settings
    metrics: Metrics = field(default_factory=Metrics)
    engines: EngineManager = field(init=False)
    codec: CodecPipeline = field(init=False)
    codec_status: CodecStatus = field(default_factory=CodecStatus)
    live_searches: set[str] = field(default_factory=set)
    responses: ResponseStore = field(init=False)
    """The Responses API's stored responses (``stored_responses_bytes``)."""
    started: asyncio.Event = field(default_factory=asyncio.Event)
    exit_code: int = 0
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _token_table: TokenTable | None = None

    def __post_init__(self) -> None:
        s = self.settings
        self.engines = EngineManager(s)
        self.responses = ResponseStore(s.stored_responses_bytes)
        limits = Limits(max_segments=s.codec_max_segments, max_total_original=s.codec_max_output_bytes,
                        max_context=s.codec_max_context_bytes)
        self.codec = CodecPipeline(s.max_model_len, s.codec_segments_in_flight, limits,
                                   write_version=s.codec_container_version)
        if not s.enable_codec:
            self.codec_status.set(CodecState.DISABLED,
                                  "the codec is disabled on this server (CASCADE_ENABLE_CODEC=false)")

    def ready_codec(self) -> CodecPipeline:
        """The codec, or ``CodecUnavailableError`` with the reason it cannot serve."""
        if self.codec_status.state is not CodecState.READY:
            raise CodecUnavailableError(self.codec_status.reason)
        return self.codec

    def token_table(self) -> TokenTable:
        """Every token's text and bytes (the export renders with it), built once."""
        from cascade.export.token_table import build_token_table

        if self._token_table is None:
            self._token_table = build_token_table(self.engines.tokenizer)
        return self._token_table

    def engine_dead(self) -> bool:
        return self.engines.dead

    # ---------------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start engines, watchdogs and the codec in the background (the server answers meanwhile)."""
        self._tasks.append(asyncio.create_task(self._start_all()))
        self._tasks.append(asyncio.create_task(asyncio.to_thread(_import_grammar_compiler)))

    async def stop(self) -> None:
        """Cancel background work, close the codec runners and stop the engines."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.to_thread(self.codec.close)
        await self.engines.close()
        logger.info("engines stopped")

    def _fail_fast(self, reason: str) -> None:
        """Exit non-zero so a supervisor (Docker, k8s, systemd) restarts the service."""
        logger.error("stopping the service", extra={"reason": reason})
        self.exit_code = 1
        os.kill(os.getpid(), signal.SIGTERM)

    async def _start_all(self) -> None:
        try:
            await self.engines.start()
        except Exception:
            self._fail_fast(self.engines.not_ready_reason())
            return
        self._tasks.append(asyncio.create_task(self._watch_dead()))
        if self.settings.engine_stall_seconds:
            self._tasks.append(asyncio.create_task(self._watch_stall(self.settings.engine_stall_seconds)))
        try:
            if self.settings.enable_codec:
                await self._start_codec()
        finally:
            self.started.set()

    async def _watch_dead(self) -> None:
        while True:
            await asyncio.sleep(self.settings.watchdog_seconds)
            if self.engines.dead:
                self._fail_fast(self.engines.not_ready_reason())
                return

    async def _watch_stall(self, stall: float) -> None:
        """A hung engine (alive, answering nothing) is as bad as a dead one but never sets ``errored``.
        Engines answer a state query between two steps, so no answer within ``stall`` seconds means
        no step finished in that time."""
        while True:
            await asyncio.sleep(max(self.settings.watchdog_seconds, stall / 4))
            try:
                await self.engines.live_state(timeout=stall)
            except TimeoutError:
                self._fail_fast(f"an engine answered no liveness query within {stall:g} s (engine_stall_seconds): "
                                "it stopped making progress")
                return
            except Exception:  # a dead engine is the other watch's to report
                continue

    async def _start_codec(self) -> None:
        """Load the exact model next to the engines (no vLLM engine of its own), then self-test it."""
        from cascade.codec.exact.device import load_codec_model
        from cascade.codec.exact.known_answer import check_known_answer, reference_path
        from cascade.codec.exact.model import NUMERICS_VERSION
        from cascade.codec.exact.runner import ExactRunner, single_threaded

        s = self.settings
        known_answer = reference_path(self.engines.fingerprint)
        try:
            model, moved, checked = await asyncio.to_thread(
                load_codec_model, s.codec_device, s.model, s.max_model_len, s.codec_kernels,
                known_answer if s.codec_selftest and known_answer.exists() else None)
        except (OSError, ValueError, KeyError) as exc:
            self.codec_status.set(CodecState.UNSUPPORTED,
                                  f"codec disabled: the exact codec cannot run this model ({exc})")
            return
        if moved:
            logger.warning(moved)
        logger.info("exact codec model loaded", extra={"kernels": model.kernel_summary(), "bytes": model.nbytes()})
        def runner(threads: int | None, machine_root: bool = False) -> ExactRunner:
            return ExactRunner(model, model.config.vocab_size, s.codec_max_rows, s.codec_prefill_tokens, threads,
                               kv_budget_bytes=s.codec_kv_budget_mib << 20, max_draft=s.codec_max_draft,
                               interleave_tokens=s.codec_interleave_tokens, machine_root=machine_root,
                               cuda_graphs=s.codec_cuda_graphs)

        # The second reader (rare: a segment an earlier release wrote here that fails its checksum) runs on
        # one torch thread, so the main worker stays the only thread using torch's OpenMP pool.
        self.codec.attach(runner(s.codec_threads or None), NUMERICS_VERSION, self.engines.tokenizer,
                          self.engines.fingerprint, second_reader=lambda: runner(1, machine_root=True))
        if s.codec_selftest:
            self.codec_status.set(CodecState.SELF_TEST, "the codec's startup self-test is running")
            try:
                if known_answer.exists() and not checked:
                    await asyncio.to_thread(single_threaded, check_known_answer, model, known_answer)
                await self.codec.self_test(inject_fault=s.codec_selftest_fault)
            except Exception as exc:  # whatever fails, the codec stays off with the reason; the rest serves
                self.codec_status.set(CodecState.FAILED, "codec disabled: the startup self-test failed "
                                                         f"({type(exc).__name__}: {exc})")
                return
        self.codec_status.set(CodecState.READY)
