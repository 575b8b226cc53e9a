"""Response models of the kassay API, as the SDK sees them. They mirror the server's schemas
without importing the service; unknown fields are kept (extra="allow") so an older SDK reads a
newer server."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

FINAL_STATES = frozenset({"finished", "cancelled"})


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class Progress(_Model):
    total: int
    done: int
    passed: int = 0
    failed: int = 0
    error: int = 0
    crashed: int = 0
    timeout: int = 0
    unsupported: int = 0
    skipped: int = 0


class Job(_Model):
    """A job's state and progress counts."""

    id: str
    name: str
    state: str
    labels: dict[str, str] = Field(default_factory=dict)
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    progress: Progress
    ok: bool | None = None
    links: dict[str, str] = Field(default_factory=dict)

    @property
    def is_over(self) -> bool:
        """finished or cancelled."""
        return self.state in FINAL_STATES


class JobPage(_Model):
    items: list[Job]
    next_cursor: str | None = None


class CaseResult(_Model):
    """One case's outcome; outputs/timing/memory are kept as the server sends them."""

    case_id: str
    group_id: str
    suite_index: int = 0
    op: str
    impl: str
    params: dict[str, Any] = Field(default_factory=dict)
    regime: str = "normal"
    seed: int = 0
    dtype: str = ""
    status: str
    message: str = ""
    outputs: list[dict[str, Any]] = Field(default_factory=list)
    timing: dict[str, Any] | None = None
    memory: dict[str, Any] | None = None
    duration_s: float = 0.0
    worker: str | None = None
    device: str | None = None
    environment: dict[str, Any] | None = None


class Summary(_Model):
    total: int = 0
    passed: int = 0
    failed: int = 0
    error: int = 0
    crashed: int = 0
    timeout: int = 0
    unsupported: int = 0
    skipped: int = 0
    ok: bool = True


class Report(_Model):
    """The JSON report (schema kassay.report/v1)."""

    schema_version: str
    job_id: str | None = None
    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    state: str = "finished"
    created_at: datetime | None = None
    finished_at: datetime | None = None
    environments: list[dict[str, Any]] = Field(default_factory=list)
    summary: Summary
    cases: list[CaseResult] = Field(default_factory=list)


class Worker(_Model):
    address: str
    state: str
    device: str | None = None
    device_name: str | None = None
    memory_bytes: int | None = None
    ops: dict[str, list[str]] = Field(default_factory=dict)
    running: list[str] = Field(default_factory=list)
    last_seen: datetime | None = None
    last_error: str | None = None
    environment: dict[str, Any] | None = None
    sandbox: dict[str, Any] | None = None


class Artifact(_Model):
    """Code a job may bring (a wheel or a module), stored by the sha256 of its bytes."""

    digest: str
    filename: str
    kind: str
    size: int
    created_at: datetime
    entry_points: list[str] = Field(default_factory=list)


class JobEvent(_Model):
    """One server-sent event of a job: `result` (with `result`) or `final` (with `job`)."""

    event: str
    id: int | None = None
    result: CaseResult | None = None
    job: Job | None = None


__all__ = [
    "FINAL_STATES",
    "Artifact",
    "CaseResult",
    "Job",
    "JobEvent",
    "JobPage",
    "Progress",
    "Report",
    "Summary",
    "Worker",
]
