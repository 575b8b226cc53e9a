"""Workers, health, readiness and Prometheus metrics."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kassay.api.auth import require_read
from kassay.api.deps import Services, services
from kassay.api.schemas import WorkerInfo

router = APIRouter()


@router.get(
    "/v1/workers",
    response_model=list[WorkerInfo],
    tags=["workers"],
    dependencies=[Depends(require_read)],
)
def list_workers(svc: Annotated[Services, Depends(services)]) -> list[WorkerInfo]:
    """The configured workers: up or down, device, memory, the impls they offer per op, and the
    groups they run now."""
    return svc.dispatcher.workers.info()


@router.get("/healthz", tags=["health"])
def healthz() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


_READY_BODY = {
    "application/json": {
        "example": {"database": "ok", "workers_up": 1, "workers": 1, "status": "ready"}
    }
}


@router.get(
    "/readyz",
    tags=["health"],
    responses={
        200: {"description": "ready", "content": _READY_BODY},
        503: {"description": "the database does not answer", "content": _READY_BODY},
    },
)
async def readyz(svc: Annotated[Services, Depends(services)]) -> JSONResponse:
    """Readiness: the database answers. Workers do not decide it (a job sent while none is up
    queues until one is); their count is in the body, their state in /v1/workers."""
    body: dict[str, Any] = {
        "database": "ok",
        "workers_up": svc.dispatcher.workers.up(),
        "workers": len(svc.dispatcher.workers.links),
    }
    ready = True
    try:
        await run_in_threadpool(svc.store.ping)
    except Exception as exc:
        body["database"] = f"error: {type(exc).__name__}"
        ready = False
    body["status"] = "ready" if ready else "not ready"
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get(
    "/metrics",
    tags=["health"],
    response_class=Response,
    dependencies=[Depends(require_read)],
)
async def metrics(svc: Annotated[Services, Depends(services)]) -> Response:
    """Prometheus metrics (a read: with locked reads, scrape with a read token as bearer)."""
    depth = await run_in_threadpool(svc.store.queue.queue_depth)
    counts = await run_in_threadpool(svc.store.jobs.count_by_state)
    svc.metrics.set_database_gauges(counts, depth)
    svc.metrics.workers_up.set(svc.dispatcher.workers.up())
    svc.metrics.workers_known.set(len(svc.dispatcher.workers.links))
    return Response(generate_latest(svc.metrics.registry), media_type=CONTENT_TYPE_LATEST)
