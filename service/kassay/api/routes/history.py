"""/v1/series: one case key's metric over jobs, for plots."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query

from kassay.api.auth import require_read
from kassay.api.deps import Services, services
from kassay.api.route_common import ERROR_RESPONSES, label_filters
from kassay.api.schemas import Series, SeriesPoint
from kassay.contract.results import CaseResult

router = APIRouter(tags=["history"])

Metric = Literal["device_median_ms", "rel_l2", "peak_bytes"]


def _ts(t: float | None) -> datetime | None:
    return datetime.fromtimestamp(t, timezone.utc) if t is not None else None


def _point_values(
    c: CaseResult, metric: str, output: str | None
) -> tuple[float | None, float | None, float | None, int | None]:
    """(value, low, high, n) of a case result for `metric`."""
    if metric == "device_median_ms":
        t = c.timing
        return (t.median_ms, t.p10_ms, t.p90_ms, t.n) if t else (None, None, None, None)
    if metric == "peak_bytes":
        m = c.memory
        value = m.peak_extra_bytes if m and m.peak_extra_bytes is not None else None
        return (None if value is None else float(value)), None, None, None
    errs = [o.rel_l2 for o in c.outputs if output is None or o.name == output]
    return (max(errs) if errs else None), None, None, None


@router.get(
    "/v1/series",
    response_model=Series,
    responses=ERROR_RESPONSES,
    dependencies=[Depends(require_read)],
)
def series(
    svc: Annotated[Services, Depends(services)],
    key: Annotated[
        str,
        Query(
            pattern=r"^ck_[0-9a-f]{24}$",
            description="a case key, as comparisons list them (`key` of each case)",
        ),
    ],
    labels: Annotated[list[str], Query(description="key=value; repeat to AND")] = [],  # noqa: B006
    metric: Metric = "device_median_ms",
    output: Annotated[
        str | None, Query(max_length=100, description="rel_l2: this output (else the largest)")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Series:
    """The values of one case key's metric over the last `limit` finished jobs with `labels`,
    oldest first, each with its job's labels (commit, branch, ...)."""
    wanted = label_filters(labels)
    points = []
    for row in svc.store.history.series(key, labels=wanted, limit=limit):
        c: CaseResult = row["result"]
        value, low, high, n = _point_values(c, metric, output)
        created = _ts(row["created_at"])
        assert created is not None
        points.append(
            SeriesPoint(
                job_id=row["job_id"],
                name=row["name"],
                labels=row["labels"],
                created_at=created,
                finished_at=_ts(row["finished_at"]),
                case_id=c.case_id,
                status=c.status,
                value=value,
                low=low,
                high=high,
                n=n,
            )
        )
    return Series(key=key, metric=metric, output=output, labels=wanted, points=points)
