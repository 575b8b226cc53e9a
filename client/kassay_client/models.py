"""Response models of the kassay API, as the SDK sees them. They mirror the server's schemas
without importing the service; unknown fields are kept (extra="allow") so an older SDK reads a
newer server."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

FINAL_STATES = frozenset({"finished", "cancelled"})

#: a case's statuses, worst first: the order the summaries list them in. The SDK's copy of the
#: server's list (kassay.contract.results.STATUSES; tests/unit/test_sdk_contract.py checks that
#: they are the same), kept here so that the SDK never imports the service.
STATUSES: tuple[str, ...] = (
    "crashed",
    "timeout",
    "error",
    "failed",
    "unsupported",
    "skipped",
    "passed",
)


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
    coverage: str = ""  # empty: a point of the job's grid; else why default coverage added it
    # baseline_suspect | baseline_explained | nondeterministic | biased
    flags: list[str] = Field(default_factory=list)
    #: "trusted" (the executor that judged it) or "sandbox" (code the job brought, run apart;
    #: its timing and memory were measured there)
    ran_in: str = "trusted"
    #: a convergence case's curves, matched differences and verdict (None: a per-call case)
    convergence: dict[str, Any] | None = None
    #: a short name within the report: op.impl and the params that vary within its suite
    name: str = ""
    #: where the compared series (e.g. branch=main) started to break this case key, if it does
    broken_since: str = ""


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
    cancelled: bool = False  # the job was cancelled: not ok, its unrun cases skipped
    baseline_suspect: int = 0
    baseline_explained: int = 0
    nondeterministic: int = 0
    biased: int = 0
    added_by_coverage: int = 0


class ComparisonSummary(_Model):
    cases: int = 0
    compared: int = 0
    newly_failing: int = 0
    fixed: int = 0
    new: int = 0
    missing: int = 0
    slower: int = 0
    faster: int = 0
    not_comparable: int = 0  # CPU speed the worker could not resolve (a busy host)
    less_accurate: int = 0
    more_accurate: int = 0
    more_memory: int = 0
    less_memory: int = 0
    regressions: int = 0


class CaseComparison(_Model):
    """One case key in either job; accuracy, speed and memory kept as the server sends them."""

    key: str
    op: str
    impl: str
    params: dict[str, Any] = Field(default_factory=dict)
    regime: str = "normal"
    seed: int = 0
    dtype: str = ""
    device_kind: str = ""
    case_id: str | None = None
    to_case_id: str | None = None
    status_before: str | None = None
    status_after: str | None = None
    status_change: str
    accuracy: list[dict[str, Any]] = Field(default_factory=list)
    speed: dict[str, Any] | None = None
    memory: dict[str, Any] | None = None
    regression: bool = False
    reasons: list[str] = Field(default_factory=list)


class Comparison(_Model):
    """A job against an earlier one (GET /v1/jobs/{id}/compare)."""

    job_id: str | None = None
    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    to_job_id: str | None = None
    to_name: str
    to_labels: dict[str, str] = Field(default_factory=dict)
    device_kinds: list[str] = Field(default_factory=list)
    threshold: float = 0.03
    confidence: float
    regression: bool = False
    summary: ComparisonSummary
    cases: list[CaseComparison] = Field(default_factory=list)


class SeriesPoint(_Model):
    job_id: str
    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    created_at: datetime
    finished_at: datetime | None = None
    case_id: str
    status: str
    value: float | None = None
    low: float | None = None
    high: float | None = None
    n: int | None = None


class Series(_Model):
    """A case key's metric over finished jobs, oldest first (GET /v1/series)."""

    key: str
    metric: str
    output: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    points: list[SeriesPoint] = Field(default_factory=list)


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
    comparison: Comparison | None = None


class Worker(_Model):
    address: str
    state: str
    device: str | None = None
    device_name: str | None = None
    memory_bytes: int | None = None
    ops: dict[str, list[str]] = Field(default_factory=dict)
    impl_kinds: dict[str, dict[str, str]] = Field(default_factory=dict)  # op -> impl -> kind
    running: list[str] = Field(default_factory=list)
    last_seen: datetime | None = None
    last_error: str | None = None
    environment: dict[str, Any] | None = None
    sandbox: dict[str, Any] | None = None
    found_by: str | None = None  # the DNS name (dns:/// entry) the API found this worker by


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
    "CaseComparison",
    "CaseResult",
    "Comparison",
    "ComparisonSummary",
    "Job",
    "JobEvent",
    "JobPage",
    "Progress",
    "Report",
    "Series",
    "SeriesPoint",
    "Summary",
    "Worker",
]
