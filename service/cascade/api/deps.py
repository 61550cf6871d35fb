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
    """This request's server-unique id (engine request ids and response ids derive from it; logged as
    ``internal_id``). The client's ``X-Request-Id`` is only echoed and logged, never used here."""
    rid: str = request.state.request_id
    return rid
