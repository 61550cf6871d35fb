"""Operations: liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from cascade.api.deps import get_engines, get_metrics
from cascade.api.errors import error_body
from cascade.engine.manager import EngineManager
from cascade.metrics import Metrics

router = APIRouter(tags=["operations"])


@router.get("/health")
async def health() -> dict[str, str]:
    """The process is alive (no engine check: a supervisor restarts on this failing)."""
    return {"status": "ok"}


@router.get("/ready")
async def ready(engines: EngineManager = Depends(get_engines)) -> JSONResponse:
    """200 when every engine is up and serving; 503 with the reason otherwise."""
    if engines.ready:
        return JSONResponse({"status": "ready", "engines": engines.unfinished_requests()})
    return JSONResponse(error_body(503, engines.not_ready_reason(), code="engine_unavailable"), status_code=503,
                        headers={"Retry-After": "5"})


@router.get("/metrics")
async def metrics(engines: EngineManager = Depends(get_engines), m: Metrics = Depends(get_metrics)) -> Response:
    m.engine_ready.set(1 if engines.ready else 0)
    for role, count in engines.unfinished_requests().items():
        m.engine_unfinished.labels(role).set(count)
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)
