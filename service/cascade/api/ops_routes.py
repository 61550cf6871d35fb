"""Operations: liveness, readiness, Prometheus metrics and live per-request state."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from cascade.api.deps import get_engines, get_metrics
from cascade.api.errors import error_body
from cascade.engine.manager import EngineManager
from cascade.kcbs.engine_driver import live_searches
from cascade.metrics import Metrics

logger = logging.getLogger("cascade.ops")

router = APIRouter(tags=["operations"])


@router.get("/health")
async def health() -> dict[str, str]:
    """The process is alive (no engine check: a supervisor restarts on this failing)."""
    return {"status": "ok"}


@router.get("/ready")
async def ready(request: Request, engines: EngineManager = Depends(get_engines)) -> JSONResponse:
    """200 when every engine is up and start-up checks are done; 503 with the reason otherwise.
    A failed codec self-test does not make the service unready: everything else still serves."""
    if engines.ready and request.app.state.started.is_set():
        codec = request.app.state.codec
        return JSONResponse({"status": "ready", "engines": engines.unfinished_requests(),
                             "codec": "ok" if codec.unavailable_reason is None else codec.unavailable_reason})
    reason = engines.not_ready_reason() if not engines.ready else "start-up checks are running"
    return JSONResponse(error_body(503, reason, code="engine_unavailable"), status_code=503,
                        headers={"Retry-After": "5"})


@router.get("/metrics")
async def metrics(request: Request, engines: EngineManager = Depends(get_engines),
                  m: Metrics = Depends(get_metrics)) -> Response:
    m.engine_ready.set(1 if engines.ready else 0)
    for role, count in engines.unfinished_requests().items():
        m.engine_unfinished.labels(role).set(count)
    m.kcbs_live_searches.set(live_searches())
    m.codec_live_jobs.set(codec_jobs(request))
    if engines.ready:
        try:
            state = await engines.live_state(timeout=2.0)
        except Exception as exc:  # a busy or dying engine: keep the last values, never fail the scrape
            logger.warning("live-state query failed", extra={"error": f"{type(exc).__name__}: {exc}"})
        else:
            for role, counts in state.items():
                for kind, value in counts.items():
                    m.engine_live_state.labels(role, kind).set(value)
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)


def codec_jobs(request: Request) -> int:
    runner = request.app.state.codec.runner
    return 0 if runner is None else int(runner.live_jobs())


@router.get("/ops/live-state")
async def live_state(request: Request, engines: EngineManager = Depends(get_engines)) -> dict[str, Any]:
    """Live per-request state: inside each engine (its unfinished requests, vLLM's runner requests
    and batch rows, the proposer's prediction states) and in the gateway (k-CBS searches, the exact
    codec's queued and running jobs). All zero on an idle service; needs the API key like every
    route but ``/health``."""
    return {"engines": await engines.live_state(),
            "gateway": {"kcbs_searches": live_searches(), "codec_jobs": codec_jobs(request)}}
