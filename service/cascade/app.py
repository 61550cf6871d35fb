"""App factory: routers, middleware, error handlers, and a lifespan that owns the engines."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from cascade import __version__
from cascade.api import kcbs_routes, openai_routes, ops_routes
from cascade.api.errors import install_error_handlers
from cascade.api.middleware import GatewayMiddleware
from cascade.engine.manager import EngineManager
from cascade.metrics import Metrics
from cascade.settings import Settings

logger = logging.getLogger("cascade.app")


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the ASGI app; engines start in the background when the server starts."""
    settings = settings or Settings()
    metrics = Metrics()
    engines = EngineManager(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        start = asyncio.create_task(engines.start())
        app.state.engine_start = start
        try:
            yield
        finally:
            if not start.done():
                start.cancel()
            await asyncio.gather(start, return_exceptions=True)
            await asyncio.to_thread(engines.shutdown)
            logger.info("engines stopped")

    app = FastAPI(title="Cascade", version=__version__, lifespan=lifespan)
    app.state.settings = settings
    app.state.engines = engines
    app.state.metrics = metrics
    install_error_handlers(app)
    app.include_router(ops_routes.router)
    app.include_router(openai_routes.router)
    app.include_router(kcbs_routes.router)
    app.add_middleware(GatewayMiddleware, settings=settings, metrics=metrics)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["*"],
                           allow_headers=["*"])
    return app
