"""Response bodies of the REST API (the OpenAPI schema at /docs is built from these)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel, Field

from kassay.api.store import ArtifactRecord, JobRecord


class Progress(BaseModel):
    total: int
    done: int
    passed: int = 0
    failed: int = 0
    error: int = 0
    crashed: int = 0
    timeout: int = 0
    unsupported: int = 0
    skipped: int = 0


class JobLinks(BaseModel):
    self: str
    report: str
    events: str
    cancel: str


class Job(BaseModel):
    """A job's state and progress."""

    id: str
    name: str
    state: str = Field(description="queued | running | finished | cancelled")
    labels: dict[str, str]
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    progress: Progress
    ok: bool | None = Field(
        None, description="once over: no case failed, errored, crashed or timed out"
    )
    links: JobLinks

    @classmethod
    def of(cls, rec: JobRecord) -> Job:
        def ts(t: float | None) -> datetime | None:
            return datetime.fromtimestamp(t, timezone.utc) if t is not None else None

        base = f"/v1/jobs/{rec.id}"
        created = ts(rec.created_at)
        assert created is not None
        return cls(
            id=rec.id,
            name=rec.name,
            state=rec.state,
            labels=rec.labels,
            created_at=created,
            started_at=ts(rec.started_at),
            finished_at=ts(rec.finished_at),
            progress=Progress(total=rec.total, done=rec.done, **rec.counts),
            ok=rec.ok,
            links=JobLinks(
                self=base, report=f"{base}/report", events=f"{base}/events", cancel=f"{base}/cancel"
            ),
        )


class JobPage(BaseModel):
    items: list[Job]
    next_cursor: str | None = Field(None, description="pass as ?cursor= for the next page")


class WorkerInfo(BaseModel):
    address: str
    state: str = Field(description="up | down | unknown")
    device: str | None = None
    device_name: str | None = None
    memory_bytes: int | None = None
    ops: dict[str, list[str]] = Field(default_factory=dict, description="op -> impl names")
    impl_kinds: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description="op -> impl -> kind (builtin, peer, plugin, mutant, alternative, testing)",
    )
    running: list[str] = Field(
        default_factory=list,
        description="job_id/group_id in flight (never the run ids the worker knows them by: "
        "those stay between the API and its workers)",
    )
    last_seen: datetime | None = None
    last_error: str | None = None
    environment: dict[str, Any] | None = None
    sandbox: dict[str, Any] | None = Field(
        None,
        description="how the worker confines artifact code: network, filesystem, processes, "
        "user, limits, and notes on what it does not stop",
    )
    found_by: str | None = Field(
        None, description="the DNS name (a dns:/// entry of KASSAY_WORKERS) this address came from"
    )


class Artifact(BaseModel):
    """Code a job may bring: a wheel or a single module, stored by the sha256 of its bytes."""

    digest: str = Field(description="sha256 of the bytes, lowercase hex: what a job names")
    filename: str
    kind: str = Field(description="wheel | module")
    size: int
    created_at: datetime
    entry_points: list[str] = Field(
        default_factory=list,
        description="its kassay.impls entry points (on upload; empty when read back)",
    )

    @classmethod
    def of(cls, rec: ArtifactRecord, *, entry_points: list[str] | None = None) -> Artifact:
        return cls(
            digest=rec.digest,
            filename=rec.filename,
            kind=rec.kind,
            size=rec.size,
            created_at=datetime.fromtimestamp(rec.created_at, timezone.utc),
            entry_points=entry_points or [],
        )


class ErrorBody(BaseModel):
    error: str
    message: str
    details: dict[str, Any] = Field(default_factory=dict)


class SeriesPoint(BaseModel):
    """One job's value of a case key's metric."""

    job_id: str
    name: str
    labels: dict[str, str] = Field(description="the job's labels (commit, branch, ...)")
    created_at: datetime
    finished_at: datetime | None = None
    case_id: str
    status: str
    value: float | None = Field(None, description="absent when the case has no such value")
    low: float | None = Field(None, description="device_median_ms: the p10 of the samples")
    high: float | None = Field(None, description="device_median_ms: the p90 of the samples")
    n: int | None = Field(None, description="device_median_ms: repetitions")


class Series(BaseModel):
    """A case key's metric over finished jobs, oldest first."""

    key: str
    metric: str
    output: str | None = Field(
        None, description="rel_l2: the output; absent: the largest of the case's outputs"
    )
    labels: dict[str, str] = Field(description="the label filter")
    points: list[SeriesPoint]
