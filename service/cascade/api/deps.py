"""FastAPI dependencies: the app's ``Gateway`` and what routes take from it, instead of module globals."""

from __future__ import annotations

from fastapi import Request

from cascade.engine.manager import EngineManager
from cascade.lifecycle import Gateway
from cascade.metrics import Metrics
from cascade.settings import Settings


def get_gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


def get_settings(request: Request) -> Settings:
    return get_gateway(request).settings


def get_engines(request: Request) -> EngineManager:
    return get_gateway(request).engines


def get_metrics(request: Request) -> Metrics:
    return get_gateway(request).metrics


def reply_id(request: Request) -> str:
    """The id a reply shows after ``cmpl-``/``chatcmpl-``: vLLM's ``request_id`` field when the body set it
    (``name_reply``), else ``request_id``."""
    named: str | None = getattr(request.state, "reply_id", None)
    return named or request_id(request)


def name_reply(request: Request, name: str | None) -> None:
    """vLLM's ``request_id``: the client names its reply; engine request ids stay the server's own."""
    if name is not None:
        request.state.reply_id = name


def request_id(request: Request) -> str:
    """This request's server-unique id (engine request ids and response ids derive from it; logged as
    ``internal_id``). The client's ``X-Request-Id`` is only echoed and logged, never used here."""
    rid: str = request.state.request_id
    return rid
