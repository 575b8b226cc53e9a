"""/v1/jobs: submit, list, get, report, compare, events (SSE), cancel."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from sse_starlette.sse import EventSourceResponse

from kassay import reports
from kassay.api.auth import code_denial, require_read, require_write
from kassay.api.comparisons import compare, report_with_verdict
from kassay.api.deps import Services, services
from kassay.api.route_common import ERROR_RESPONSES, label_filters, read_body
from kassay.api.schemas import Job, JobPage
from kassay.api.store import ACTIVE_STATES
from kassay.api.submit import admit
from kassay.contract.comparison import Comparison
from kassay.contract.spec import NO_CONTROL
from kassay.errors import InvalidSpecError, KassayError

_COALESCE_S = 0.02  # how long an SSE stream lets results gather after a wake-up

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

JobState = Literal["queued", "running", "finished", "cancelled"]
#: ?format= names one of the report registry's formats (kassay.reports.FORMATS)
_FORMAT = Query(
    pattern="^(" + "|".join(reports.FORMATS) + ")$",
    description="one of: " + ", ".join(reports.FORMATS),
)


@router.post(
    "",
    status_code=201,
    response_model=Job,
    responses={
        **ERROR_RESPONSES,
        200: {
            "model": Job,
            "description": "the job an earlier request with the same Idempotency-Key created",
        },
    },
    dependencies=[Depends(require_write)],
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/JobSpec"}},
                "application/yaml": {
                    "schema": {
                        "type": "string",
                        "description": "the same JobSpec written as YAML (aliases bounded)",
                    }
                },
            },
        }
    },
)
async def create_job(
    request: Request,
    response: Response,
    svc: Annotated[Services, Depends(services)],
    idempotency_key: Annotated[
        str | None, Header(min_length=1, max_length=200, pattern=NO_CONTROL)
    ] = None,
) -> Job:
    """Submit a job spec (JSON or YAML). The same `Idempotency-Key` returns the same job
    (200 instead of 201)."""
    if idempotency_key is not None and not idempotency_key.strip():
        # an empty header passes the header's own checks; as a key it would make the second
        # submission a unique-key conflict (a 500 schemathesis found)
        raise InvalidSpecError(
            "Idempotency-Key must not be empty", details={"loc": ["header", "idempotency-key"]}
        )
    body = await read_body(request, svc.settings.max_body_bytes)
    t0 = time.perf_counter()
    try:
        admitted = await run_in_threadpool(
            admit,
            body,
            request.headers.get("content-type"),
            store=svc.store,
            workers=svc.dispatcher.workers,
            settings=svc.settings,
            idempotency_key=idempotency_key,
            code_denial=code_denial(request),
        )
    except KassayError as exc:
        svc.metrics.jobs_refused.labels(type(exc).__name__).inc()
        raise
    job = Job.of(admitted.job)
    response.headers["Location"] = job.links.self
    if admitted.created:
        svc.metrics.jobs_submitted.inc()
        svc.metrics.observe_admission(admitted.ops, time.perf_counter() - t0)
        svc.dispatcher.wake()
    else:
        response.status_code = 200
    return job


@router.get("", response_model=JobPage, dependencies=[Depends(require_read)])
def list_jobs(
    svc: Annotated[Services, Depends(services)],
    state: JobState | None = None,
    label: Annotated[list[str], Query(description="key=value; repeat to AND")] = [],  # noqa: B006
    name: str | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(pattern=r"^[0-9]{1,18}$")] = None,
) -> JobPage:
    """Jobs, newest first, filtered by state, labels and name; paginated by cursor."""
    rows = svc.store.jobs.list_jobs(
        state=state,
        labels=label_filters(label),
        name=name,
        limit=limit + 1,
        before=int(cursor) if cursor else None,
    )
    more = len(rows) > limit
    rows = rows[:limit]
    return JobPage(
        items=[Job.of(r) for r in rows], next_cursor=str(rows[-1].seq) if more and rows else None
    )


@router.get("/{job_id}", response_model=Job, responses=ERROR_RESPONSES)
async def get_job(job_id: str, request: Request) -> Response:
    """A job's state and progress counts."""
    # The hottest route (CI polls it), kept lean: no dependency injection, one primary-key
    # read on the event loop (cheaper than a thread hop for a sub-millisecond query), the body
    # serialized once.
    await require_read(request)
    svc: Services = request.app.state.services
    job = svc.store.jobs.require_job(job_id)
    return Response(Job.of(job).model_dump_json(), media_type="application/json")


@router.get(
    "/{job_id}/report",
    responses={
        **ERROR_RESPONSES,
        200: {"content": {f.media_type: {} for f in reports.FORMATS.values()}},
    },
    dependencies=[Depends(require_read)],
)
def get_report(
    job_id: str,
    request: Request,
    svc: Annotated[Services, Depends(services)],
    format: Annotated[str | None, _FORMAT] = None,
) -> Response:
    """The job's report (partial while it runs) in one of the registry's formats (JSON, JUnit
    XML, Markdown, HTML), chosen by `?format=` or else by the Accept header (JSON by
    default)."""
    chosen = reports.get(format) if format is not None else None
    if chosen is None:
        for part in request.headers.get("accept", "").split(","):
            chosen = reports.by_media_type(part.split(";")[0].strip().lower())
            if chosen is not None:
                break
    fmt = chosen or reports.get("json")
    report = report_with_verdict(svc.store, job_id)
    media = fmt.media_type + ("; charset=utf-8" if fmt.charset else "")
    headers = {}
    if fmt.name != "html":  # a page opens in the browser; the others download by name
        headers["Content-Disposition"] = f'inline; filename="{job_id}.{fmt.extension}"'
    return Response(fmt.render(report), media_type=media, headers=headers)


@router.get(
    "/{job_id}/compare",
    response_model=Comparison,
    responses={**ERROR_RESPONSES, 200: {"content": {"application/json": {}, "text/markdown": {}}}},
    dependencies=[Depends(require_read)],
)
def compare_job(
    job_id: str,
    svc: Annotated[Services, Depends(services)],
    to: Annotated[str | None, Query(max_length=40, description="a job id")] = None,
    to_labels: Annotated[
        list[str],
        Query(
            description="key=value (repeat to AND): the latest finished job with the same name, "
            "these labels and the same device kind"
        ),
    ] = [],  # noqa: B006
    threshold: Annotated[
        float | None,
        Query(gt=0, le=10, description="regression threshold (0.03: 3%) of suites that set none"),
    ] = None,
    format: Literal["json", "markdown"] = "json",
) -> Response:
    """The job against another, case key by case key: status changes (newly failing, fixed,
    new, missing), accuracy, speed (device median ratio with its confidence interval) and
    memory changes, and which of them are regressions. Without `to` or `to_labels`: the
    verdict the job's spec asks for (compare_to), recorded with the job once it is over.
    404 when no job matches; 409 when the jobs ran on different kinds of device."""
    from kassay.reports.comparison_markdown import to_markdown

    result = compare(
        svc.store, job_id, to=to, to_labels=label_filters(to_labels) or None, threshold=threshold
    )
    if format == "markdown":
        return Response(to_markdown(result), media_type="text/markdown; charset=utf-8")
    return Response(result.model_dump_json(), media_type="application/json")


@router.get(
    "/{job_id}/events",
    responses=ERROR_RESPONSES,
    dependencies=[Depends(require_read)],
    response_class=EventSourceResponse,
)
async def job_events(
    job_id: str,
    request: Request,
    svc: Annotated[Services, Depends(services)],
    after: Annotated[
        int, Query(ge=0, lt=2**63, description="skip results up to this event id")
    ] = 0,
    last_event_id: Annotated[str | None, Header(max_length=100)] = None,
) -> EventSourceResponse:
    """Server-sent events: one `result` event per case result (id = its sequence number in the
    job, data = the CaseResult JSON), in the order they were stored, then one `final` event
    with the job (state, progress). Reconnect with Last-Event-ID to resume."""
    await run_in_threadpool(svc.store.jobs.require_job, job_id)
    start = after
    if last_event_id:
        if not re.fullmatch(r"[0-9]{1,18}", last_event_id):
            raise InvalidSpecError(
                "Last-Event-ID must be an event id this stream sent (a decimal number)",
                details={"errors": [{"loc": ["header", "last-event-id"], "msg": "not an id"}]},
            )
        start = max(start, int(last_event_id))

    async def stream() -> AsyncIterator[dict[str, Any]]:
        seen = start
        while True:
            job = await run_in_threadpool(svc.store.jobs.require_job, job_id)
            rows = await run_in_threadpool(svc.store.results.results_since, job_id, seen)
            for seq, result in rows:
                seen = seq
                yield {"event": "result", "id": str(seq), "data": json.dumps(result)}
            if rows:
                continue
            if job.state not in ACTIVE_STATES and seen >= job.done:
                yield {"event": "final", "id": str(seen), "data": Job.of(job).model_dump_json()}
                return
            if await request.is_disconnected():
                return
            await svc.notifier.wait(job_id, timeout=1.0)
            # Results arrive in bursts (one per case of a group): read a burst with one query
            # instead of two queries per result.
            await asyncio.sleep(_COALESCE_S)

    return EventSourceResponse(stream(), ping=10)


@router.post(
    "/{job_id}/cancel",
    response_model=Job,
    responses=ERROR_RESPONSES,
    dependencies=[Depends(require_write)],
)
async def cancel_job(job_id: str, svc: Annotated[Services, Depends(services)]) -> JSONResponse:
    """Cancel a job: queued groups never run, running ones are stopped, cases without a result
    become `skipped`. Cancelling a job that is over returns it unchanged."""
    job, running = await run_in_threadpool(svc.store.queue.cancel_job, job_id)
    await svc.dispatcher.cancel_runs(running)
    svc.notifier.notify(job_id)
    return JSONResponse(Job.of(job).model_dump(mode="json"))
