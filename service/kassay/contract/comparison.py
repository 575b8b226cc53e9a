"""The comparison of a job with an earlier one: what changed per case key (status, accuracy,
speed, memory) and whether any change is a regression. These pydantic models are part of the
report schema (Report.comparison); kassay.validate.compare_reports builds them.

A case key is what makes two cases of different jobs the same case: op, impl, canonical params
(the op's defaults filled in), regime, seed, dtype and the device kind (e.g. "NVIDIA H200").
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

#: the threshold a suite, a job's compare_to and a request leave unset: 3%
DEFAULT_THRESHOLD = 0.03

StatusChange = Literal["same", "newly_failing", "fixed", "new", "missing", "changed"]


class OutputChange(BaseModel):
    """One output's error moved beyond what the tolerance policy treats as noise."""

    output: str
    metric: Literal["rel_l2", "max_abs", "nonfinite"]
    before: float
    after: float
    limit: float = Field(description="the change counts past this value (factor x + floor)")
    change: Literal["worse", "better"]


class SpeedChange(BaseModel):
    """new device median / old device median, with its confidence interval; host-normalised
    on the CPU when both runs timed the same calibration (kassay.validate.compare_reports)."""

    clock: str
    before_ms: float
    after_ms: float
    ratio: float
    low: float
    high: float
    confidence: float
    method: str = Field(description="batch_medians | rel_sem (kassay.validate.median_ratio)")
    host_normalised: bool = Field(
        False,
        description="ratio, low and high are of the medians of repetition / calibration time "
        "(CPU: both jobs timed the same calibration workload beside every repetition, "
        "kassay.validate.host_calibration), so the host's drift between the jobs cancels; "
        "before_ms and after_ms stay the plain medians",
    )
    raw_ratio: float | None = Field(
        None, description="after_ms / before_ms: the plain ratio of the medians"
    )
    threshold: float
    verdict: Literal["slower", "faster", "same", "not_comparable"] = Field(
        description="slower: ratio > 1 + threshold and the interval above 1; faster: the "
        "mirror; not_comparable: CPU timings whose interval spans more than the worker can "
        "resolve (a busy host: kassay.validate.compare_reports.NOT_COMPARABLE_SPREAD), or wall-clock "
        "timings during which waiting for a CPU could make a change of the threshold's size "
        "or the one measured (TimingStats.cpu_pressure), never a regression"
    )


class MemoryChange(BaseModel):
    before_bytes: int
    after_bytes: int
    ratio: float | None = None
    threshold: float
    verdict: Literal["more", "less", "same"]


class CaseComparison(BaseModel):
    """One case key in either job."""

    key: str
    op: str
    impl: str
    params: dict[str, Any]
    regime: str
    seed: int
    dtype: str
    device_kind: str
    case_id: str | None = Field(None, description="the case in this job (absent: missing)")
    to_case_id: str | None = Field(None, description="the case in the other job (absent: new)")
    status_before: str | None = None
    status_after: str | None = None
    status_change: StatusChange
    accuracy: list[OutputChange] = Field(default_factory=list)
    speed: SpeedChange | None = None
    memory: MemoryChange | None = None
    regression: bool = Field(
        False, description="newly failing, slower, less accurate or using more memory"
    )
    reasons: list[str] = Field(default_factory=list, description="one line per regression")


class ComparisonSummary(BaseModel):
    cases: int = 0
    compared: int = Field(0, description="keys in both jobs")
    newly_failing: int = 0
    fixed: int = 0
    new: int = 0
    missing: int = 0
    slower: int = 0
    faster: int = 0
    not_comparable: int = Field(0, description="keys whose CPU speed the worker could not resolve")
    less_accurate: int = 0
    more_accurate: int = 0
    more_memory: int = 0
    less_memory: int = 0
    regressions: int = 0


class Comparison(BaseModel):
    """A job (`job_id`) against an earlier one (`to_job_id`)."""

    job_id: str | None = None
    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    to_job_id: str | None = None
    to_name: str
    to_labels: dict[str, str] = Field(default_factory=dict)
    device_kinds: list[str] = Field(default_factory=list)
    threshold: float = Field(DEFAULT_THRESHOLD, description="the threshold of suites that set none")
    confidence: float
    regression: bool = Field(False, description="some case key regressed")
    summary: ComparisonSummary
    cases: list[CaseComparison]
