"""Result models: what one case produces, and the versioned report of a job.

These pydantic models are the JSON report schema (published as docs/report.schema.json, checked
against the models by a test); the worker's protobuf messages mirror them field for field.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

from kassay.contract.comparison import Comparison

REPORT_SCHEMA_VERSION: Literal["kassay.report/v1"] = "kassay.report/v1"

Status = Literal["passed", "failed", "error", "crashed", "timeout", "unsupported", "skipped"]
# Flags a case carries beside its status: why a verdict is what it is.
#   baseline_suspect: the group's baseline is far from the truth; its limits were not used.
#   baseline_explained: (on the baseline's case) its error would be suspect, but the case's
#     precision explains it (e.g. flce's 16-bit logits at |z| ~ 1e3): its limits were used; the
#     message gives both errors.
#   nondeterministic: two runs on the same inputs differ (fails unless the impl declares it).
#   biased: an output is scaled by a systematic factor beyond the baseline's.
FLAGS: tuple[str, ...] = ("baseline_suspect", "baseline_explained", "nondeterministic", "biased")

#: every case status, in report order (the one list: the store's count columns, the reports'
#: tallies and the summary read it)
STATUSES: tuple[str, ...] = get_args(Status)
#: the statuses of a case that ran and was judged wrong, or did not finish
BAD_STATUSES: tuple[str, ...] = ("failed", "error", "crashed", "timeout")
#: the statuses that are no verdict on the impl (it cannot run these params; the device cannot
#: judge them): skipped in JUnit and pytest, not counted by the self-test
NOT_JUDGED: tuple[str, ...] = ("unsupported", "skipped")


def _null_is_nan(v: Any) -> Any:
    return float("nan") if v is None else v


#: an element's value, which may be NaN or ±Inf: JSON has no such numbers, so the report writes
#: null (pydantic's default), and reading null gives NaN back (a report with a NaN element
#: once failed its own schema and could not be read back)
MaybeFinite = Annotated[
    float,
    BeforeValidator(_null_is_nan),
    WithJsonSchema({"type": ["number", "null"], "description": "null: NaN or infinite"}),
]


class WorstEntry(BaseModel):
    index: list[int]
    value: MaybeFinite
    reference: MaybeFinite
    abs_err: MaybeFinite


class OutputMetrics(BaseModel):
    """Errors of one output against the float64 reference, and the tolerance verdict."""

    model_config = ConfigDict(extra="forbid")
    name: str
    dtype: str
    expected_dtype: str
    shape: list[int]
    max_abs: float
    max_rel: float
    rel_l2: float
    max_ulp: float
    nan: int
    inf: int
    ref_nan: int
    ref_inf: int
    n_bad: int = 0
    worst: list[WorstEntry] = Field(default_factory=list)
    policy: str = "baseline"
    threshold_max_abs: float | None = None
    threshold_rel_l2: float | None = None
    baseline_max_abs: float | None = None
    baseline_rel_l2: float | None = None
    passed: bool = True
    reason: str = ""
    # Verdict checks beyond the tolerance (None: not checked, e.g. a missing output).
    baseline_suspect: bool = False  # the baseline's own error here is far above the floor
    bias: float | None = None  # s of the least-squares fit out ~ (1 + s) * ref
    bias_limit: float | None = None  # largest |s - baseline's s| accepted
    run_to_run_max_abs: float | None = None  # max |run 1 - run 2| (0: bit-identical)


class TimingStats(BaseModel):
    """One case's timing. The statistics (median_ms ... rel_sem) are of **device** time per call
    on CUDA (see kassay.validate.timing: `mode` graph = CUDA-graph replay, events = direct
    calls back to back), of the monotonic clock on the CPU (`mode` cpu); throughput, roofline
    and speed-up derive from median_ms. `wall_median_ms` is host + device per call and
    `host_overhead_ms` their difference. The SM clock and board power are medians of samples
    taken during the repetitions; `throttle_reasons` lists what held the clocks down (thermal,
    hardware slowdown) and `power_capped` says the board sat at its power limit."""

    model_config = ConfigDict(extra="forbid")
    clock: Literal["cuda_events", "cpu_perf_counter", "cpu_process_time"]
    mode: Literal["graph", "events", "cpu"] = "events"
    n: int
    median_ms: float
    mean_ms: float
    std_ms: float
    p10_ms: float
    p90_ms: float
    rel_sem: float
    l2_flushed: bool = False
    tflops: float | None = None
    gbps: float | None = None
    roofline_fraction: float | None = None
    speedup_vs_baseline: float | None = None
    wall_median_ms: float | None = None
    host_overhead_ms: float | None = None
    graph_fallback: str | None = None
    sm_clock_mhz: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    throttle_reasons: list[str] = Field(default_factory=list)
    power_capped: bool = False
    samples_ms: list[float] = Field(
        default_factory=list,
        description="every repetition's time in the order measured: comparisons between jobs "
        "judge a change against this spread (kassay.validate.median_ratio)",
    )
    calibration: str | None = Field(
        None,
        description="CPU: the fixed workload timed right after every repetition "
        "(kassay.validate.host_calibration: its version, the torch version, threads); absent "
        "when none was timed (CUDA, the policy's cpu_calibration off, results before it)",
    )
    calibration_ms: list[float] = Field(
        default_factory=list,
        description="CPU: that workload's time after each repetition, one per samples_ms (same "
        "clock): samples_ms[i] / calibration_ms[i] is the case's time in units of the host's "
        "speed of the moment, which comparisons between jobs use (host-normalised)",
    )
    cpu_pressure: float | None = Field(
        None,
        description="CPU: the share (0-1) of the timed window in which some task waited for a "
        "CPU (Linux PSI cpu 'some', the worker's cgroup where it has one): the wall-clock "
        "repetitions were inflated by at most 1 / (1 - cpu_pressure), which comparisons between "
        "jobs allow for; absent where PSI cannot be read (and on CUDA)",
    )

    @property
    def throttled(self) -> bool:
        return bool(self.throttle_reasons)


class MemoryStats(BaseModel):
    model_config = ConfigDict(extra="forbid")
    measured: bool
    peak_extra_bytes: int | None = None
    model_bytes: int
    ratio_to_model: float | None = None
    note: str = ""


class Environment(BaseModel):
    model_config = ConfigDict(extra="allow")
    device: str
    device_name: str
    driver: str | None = None
    cuda: str | None = None
    torch: str
    triton: str | None = None
    kassay: str
    python: str
    hostname: str
    clocks: dict[str, str] = Field(default_factory=dict)
    ceilings: dict[str, float] = Field(default_factory=dict)


class ConvergenceResult(BaseModel):
    """What a convergence case trained (kassay.validate.convergence): held-out loss curves per
    seed, the matched differences against the baseline and their verdict. Non-finite losses
    are null."""

    model_config = ConfigDict(extra="forbid")
    verdict: Literal["passed", "failed", "inconclusive"]
    steps: int
    seeds: list[int]
    eval_steps: list[int]
    #: per seed, the held-out loss at each eval step (reference head and merge)
    curves: list[list[float | None]]
    #: the baseline's (and the control arm's) curves, for the band
    baseline_curves: list[list[float | None]]
    control: str
    control_curves: list[list[float | None]]
    #: per seed: final held-out loss minus the baseline's (matched seeds)
    diffs: list[float | None]
    control_diffs: list[float | None]
    mean_diff: float | None
    ci_low: float | None  # the 90% interval (two one-sided tests at 5%)
    ci_high: float | None
    margin: float  # nats: max(margin_sigma x sigma_seed, margin_floor)
    sigma_seed: float  # the baseline's held-out loss spread across seeds
    #: the differences stand out from the control arm's (correct kernels' benign band); a failed
    #: verdict's always do (beyond the margin)
    detectable: bool
    #: the impl's calls in one run (checked: an impl that is not called cannot pass)
    calls: int
    entropy_floor: float  # what a perfect model scores on the held-out data (nats)
    uniform_loss: float  # what a model that learned nothing scores


class CaseResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    case_id: str
    group_id: str
    suite_index: int = 0
    op: str
    impl: str
    params: dict[str, Any]
    regime: str
    seed: int
    dtype: str
    status: Status
    message: str = ""
    outputs: list[OutputMetrics] = Field(default_factory=list)
    timing: TimingStats | None = None
    memory: MemoryStats | None = None
    duration_s: float = 0.0
    worker: str | None = None
    device: str | None = None
    environment: Environment | None = None
    # Empty for points of the user's grid; else what default coverage added this point for
    # (e.g. "ragged sizes", "regime fa2_inf", "options bias+softcap").
    coverage: str = ""
    flags: list[str] = Field(default_factory=list)  # a subset of FLAGS
    name: str = Field(
        "",
        description="a short name within its report: op.impl, the params that vary within its "
        "suite, the regime and seed where those vary, why coverage added it "
        "(kassay.contract.names); set when a report is made. The case key stays the identity",
    )
    broken_since: str = Field(
        "",
        description="for a case not passing in a job compared with a labelled series (e.g. "
        "branch=main): the commit (or job) of that series where its case key started to break, "
        "when it is broken there too; empty: not broken there (new in this job) or unknown",
    )
    convergence: ConvergenceResult | None = Field(
        None, description="a convergence case's curves, differences and verdict"
    )
    ran_in: Literal["trusted", "sandbox"] = Field(
        "trusted",
        description="where the impl's code ran: `trusted` (the executor that judges it: "
        "built-ins, peers, installed plugins) or `sandbox` (code the job brought, in its own "
        "sandboxed process; its timing and memory were measured there, its verdict here); the "
        "artifacts' digests are in the environment",
    )

    def display(self) -> str:
        """The short name when the report gave one, else op.impl and the full label."""
        return self.name or f"{self.op}.{self.impl} {self.label()}"

    def label(self) -> str:
        p = ",".join(f"{k}={v}" for k, v in self.params.items())
        cov = f" +coverage: {self.coverage}" if self.coverage else ""
        return f"{p} [{self.regime} seed={self.seed}]{cov}"


class Summary(BaseModel):
    total: int = 0
    passed: int = 0
    failed: int = 0
    error: int = 0
    crashed: int = 0
    timeout: int = 0
    unsupported: int = 0
    skipped: int = 0
    ok: bool = True
    #: the job was cancelled: its unfinished cases are `skipped` and it is not ok
    cancelled: bool = False
    # cases carrying each flag, and cases at points default coverage added
    baseline_suspect: int = 0
    baseline_explained: int = 0
    nondeterministic: int = 0
    biased: int = 0
    added_by_coverage: int = 0

    @classmethod
    def of(cls, cases: list[CaseResult], *, cancelled: bool = False) -> Summary:
        """The counts of `cases`; ok when none failed, errored, crashed or timed out and the job
        was not cancelled (a CI step reading `ok` must not pass a run that stopped short)."""
        s = cls(total=len(cases), cancelled=cancelled)
        for c in cases:
            setattr(s, c.status, getattr(s, c.status) + 1)
            for f in c.flags:
                if f in FLAGS:
                    setattr(s, f, getattr(s, f) + 1)
            s.added_by_coverage += bool(c.coverage)
        s.ok = (
            s.failed == 0 and s.error == 0 and s.crashed == 0 and s.timeout == 0 and not cancelled
        )
        return s


def named(cases: list[CaseResult]) -> list[CaseResult]:
    """`cases` with their short names set (kassay.contract.names), in place."""
    from kassay.contract.names import short_names

    names = short_names(cases)
    for c in cases:
        c.name = names.get(c.case_id, "")
    return cases


class Report(BaseModel):
    """The versioned JSON report of one job."""

    schema_version: Literal["kassay.report/v1"] = REPORT_SCHEMA_VERSION
    job_id: str | None = None
    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    state: str = "finished"
    created_at: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))
    finished_at: datetime | None = None
    environments: list[Environment] = Field(default_factory=list)
    summary: Summary
    cases: list[CaseResult]
    comparison: Comparison | None = Field(
        None, description="the job against the one its spec's compare_to names, once over"
    )
