"""App factory: routers, middleware, error handlers, and a lifespan that owns the engines."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from cascade import __version__
from cascade.api import codec_routes, kcbs_routes, openai_routes, ops_routes
from cascade.api.errors import install_error_handlers
from cascade.api.middleware import GatewayMiddleware
from cascade.codec.container import Limits
from cascade.codec.pipeline import CodecPipeline
from cascade.engine.manager import EngineManager
from cascade.metrics import Metrics
from cascade.settings import Settings

logger = logging.getLogger("cascade.app")


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the ASGI app; engines start in the background when the server starts."""
    settings = settings or Settings()
    metrics = Metrics()
    engines = EngineManager(settings)
    codec = CodecPipeline(engines, settings.max_model_len, settings.codec_segments_in_flight,
                          Limits(max_segments=settings.codec_max_segments,
                                 max_total_original=settings.codec_max_output_bytes,
                                 max_context=settings.codec_max_context_bytes))
    if not settings.enable_codec:
        codec.unavailable_reason = "the codec is disabled on this server (CASCADE_ENABLE_CODEC=false)"

    def fail_fast(reason: str) -> None:
        """Exit non-zero so a supervisor (Docker, k8s, systemd) restarts the service."""
        logger.error("stopping the service", extra={"reason": reason})
        app.state.exit_code = 1
        os.kill(os.getpid(), signal.SIGTERM)

    async def watchdog() -> None:
        while True:
            await asyncio.sleep(settings.watchdog_seconds)
            if engines.engines and any(engine.errored for engine in engines.engines.values()):
                fail_fast(engines.not_ready_reason())
                return

    async def stall_watch(stall: float) -> None:
        """A hung engine (alive, answering nothing) is as bad as a dead one but never sets ``errored``.
        Engines answer a state query between two steps, so no answer within ``stall`` seconds means
        no step finished in that time."""
        while True:
            await asyncio.sleep(max(settings.watchdog_seconds, stall / 4))
            try:
                await engines.live_state(timeout=stall)
            except TimeoutError:
                fail_fast(f"an engine answered no liveness query within {stall:g} s (engine_stall_seconds): "
                          "it stopped making progress")
                return
            except Exception:  # a dead engine is the watchdog's to report
                continue

    async def start_all() -> None:
        try:
            await engines.start()
        except Exception:
            fail_fast(engines.not_ready_reason())
            return
        app.state.watchdog = asyncio.create_task(watchdog())
        if settings.engine_stall_seconds:
            app.state.stall_watch = asyncio.create_task(stall_watch(settings.engine_stall_seconds))
        try:
            if settings.enable_codec:
                await start_codec()
        finally:
            app.state.started.set()

    async def start_codec() -> None:
        """Load the exact model next to the engines (no vLLM engine of its own), then self-test it."""
        from cascade.codec.exact.model import NUMERICS_VERSION, ExactLlama
        from cascade.codec.exact.runner import ExactRunner

        try:
            model = await asyncio.to_thread(ExactLlama.from_pretrained, settings.model, settings.max_model_len)
        except (OSError, ValueError, KeyError) as exc:
            codec.unavailable_reason = f"codec disabled: the exact codec cannot run this model ({exc})"
            logger.error("codec unavailable", extra={"reason": codec.unavailable_reason})
            return
        codec.attach(ExactRunner(model, model.config.vocab_size, settings.codec_max_rows,
                                 settings.codec_prefill_tokens, settings.codec_threads or None), NUMERICS_VERSION)
        if settings.codec_selftest:
            await codec.self_test(inject_fault=settings.codec_selftest_fault)
        else:
            codec.unavailable_reason = None
        if codec.unavailable_reason:
            logger.error("codec self-test failed", extra={"reason": codec.unavailable_reason})

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        start = asyncio.create_task(start_all())
        app.state.engine_start = start
        try:
            yield
        finally:
            if not start.done():
                start.cancel()
            await asyncio.gather(start, return_exceptions=True)
            for name in ("watchdog", "stall_watch"):
                watch = getattr(app.state, name, None)
                if watch is not None:
                    watch.cancel()
            if codec.runner is not None:
                await asyncio.to_thread(codec.runner.close)
            await asyncio.to_thread(engines.shutdown)
            logger.info("engines stopped")

    app = FastAPI(title="Cascade", version=__version__, lifespan=lifespan)
    app.state.exit_code = 0
    app.state.started = asyncio.Event()
    app.state.settings = settings
    app.state.engines = engines
    app.state.metrics = metrics
    app.state.codec = codec
    install_error_handlers(app)
    app.include_router(ops_routes.router)
    app.include_router(openai_routes.router)
    app.include_router(kcbs_routes.router)
    app.include_router(codec_routes.router)
    app.add_middleware(GatewayMiddleware, settings=settings, metrics=metrics,
                       engine_dead=lambda: any(engine.errored for engine in engines.engines.values()))
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["*"],
                           allow_headers=["*"])
    return app
