"""App factory: routers, middleware, error handlers, and a lifespan that starts and stops the ``Gateway``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from cascade import __version__
from cascade.api import codec_routes, kcbs_routes, openai_routes, ops_routes, responses_routes
from cascade.api.errors import install_error_handlers
from cascade.api.middleware import GatewayMiddleware
from cascade.lifecycle import Gateway
from cascade.settings import Settings


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the ASGI app; engines start in the background when the server starts."""
    gateway = Gateway(settings or Settings())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        gateway.start()
        try:
            yield
        finally:
            await gateway.stop()

    app = FastAPI(title="Cascade", version=__version__, lifespan=lifespan, redirect_slashes=False)
    app.state.gateway = gateway
    install_error_handlers(app)
    app.include_router(ops_routes.router)
    app.include_router(openai_routes.router)
    app.include_router(openai_routes.vllm_paths)
    app.include_router(responses_routes.router)
    app.include_router(kcbs_routes.router)
    app.include_router(codec_routes.router)
    app.add_middleware(GatewayMiddleware, settings=gateway.settings, metrics=gateway.metrics,
                       routes=app.router.routes, engine_dead=gateway.engine_dead)
    if gateway.settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=gateway.settings.cors_origins, allow_methods=["*"],
                           allow_headers=["*"])
    return app
