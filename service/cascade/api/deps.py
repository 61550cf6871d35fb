"""FastAPI dependencies: the app's settings, engines and metrics, instead of module globals."""

from __future__ import annotations

from fastapi import Request

from cascade.engine.manager import EngineManager
from cascade.metrics import Metrics
from cascade.settings import Settings


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_engines(request: Request) -> EngineManager:
    engines: EngineManager = request.app.state.engines
    return engines


def get_metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


def request_id(request: Request) -> str:
    """The id the middleware gave this request (also in logs and the ``X-Request-Id`` header)."""
    rid: str = request.state.request_id
    return rid
