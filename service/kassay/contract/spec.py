"""The job spec language: what a user posts (JobSpec, its suites and policies) and what a worker
runs (GroupSpec).

A job spec (YAML or JSON) is a name, labels and a list of suites. A suite names an op, the impls
to run, the baseline, params (a list value is a grid axis: the grid is the cartesian product of
every list-valued param), input regimes, seeds, the tolerance policy and the timing policy.
Expansion (kassay.ops.expand, a floor up: it needs the op contracts) turns a suite into input
groups (op, params, regime, seed: one set of inputs and one float64 reference) each carrying the
impls to run on them; a case is one impl in one group.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from kassay.contract.documents import load_document
from kassay.errors import InvalidSpecError

DEFAULT_MAX_CASES = 10_000

# Specs come from untrusted senders and travel to workers as protobuf: values must be what they
# say (no "16" or true for an int), finite, and fit the wire (int64) and the store's columns.
_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
#: names of ops, impls and regimes
Name = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.\-]+$")]
LabelKey = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.\-/]+$")]
#: free text a job carries (its name, label values): no control characters (a NUL byte is
#: stored by SQLite but refused by PostgreSQL's text columns; a newline forges log lines)
NO_CONTROL = r"^[^\x00-\x1f\x7f]*$"
LabelValue = Annotated[str, Field(max_length=1000, pattern=NO_CONTROL)]
MAX_LABELS = 64
#: seeds travel as int64
Seed = Annotated[int, Field(ge=0, lt=2**63)]
#: an artifact (code a job brings) by the sha256 of its bytes, lowercase hex
Digest = Annotated[str, Field(min_length=64, max_length=64, pattern=r"^[0-9a-f]{64}$")]
MAX_ARTIFACTS = 16


class TolerancePolicy(BaseModel):
    """`baseline`: error <= factor * (the same-dtype baseline's error) + a rounding floor (the
    reference rounded to the output dtype), checked on max_abs and rel_l2 (FlashAttention's test
    convention). `absolute`: |out - ref| <= atol + rtol * |ref| for every element, with per-dtype
    defaults as torch.testing uses."""

    model_config = _STRICT
    policy: Literal["baseline", "absolute"] = "baseline"
    factor: float = Field(2.0, gt=0)
    atol: float | None = Field(None, ge=0)
    rtol: float | None = Field(None, ge=0)


class TimingPolicy(BaseModel):
    """Adaptive repetitions: after `warmup` runs, repeat until the standard error of the median
    is under `target_rel_sem` of the median (at least `min_reps`, or fewer but at least three
    once they add up to `min_reps_time_s`), or `max_reps` / `budget_s` ends. On CUDA the L2
    cache is flushed before each repetition."""

    model_config = _STRICT
    enabled: bool = True
    warmup: int = Field(2, ge=0, le=100)
    min_reps: int = Field(5, ge=1, le=10_000)
    max_reps: int = Field(100, ge=1, le=100_000)
    min_reps_time_s: float = Field(
        1.0,
        ge=0,
        le=600,
        description="min_reps is met early by at least three repetitions that add up to this "
        "much time (device time on CUDA): a slow call (a float32 flce at N=8192 takes ~0.5 s) "
        "is then repeated until its statistics are good, not five times regardless, as "
        "triton.testing.do_bench sizes its repetitions from a measured call. 0: always "
        "min_reps",
    )
    budget_s: float = Field(2.0, gt=0, le=600)
    target_rel_sem: float = Field(0.01, gt=0, le=1)
    flush_l2: bool = Field(
        True, description="cold L2 (flushed before every repetition) or warm (false)"
    )
    cuda_graph: bool = Field(
        True,
        description="time CUDA-graph replays of the call where it can be captured (falls back "
        "to direct calls otherwise)",
    )
    cpu_clock: Literal["wall", "process"] = Field(
        "wall",
        description="on the CPU: `wall` (time.perf_counter: what a caller waits) or `process` "
        "(time.process_time: the CPU time of the executor process, all its threads; other "
        "processes taking the CPU away do not count, so it is steadier on a shared runner)",
    )
    cpu_calibration: bool = Field(
        True,
        description="on the CPU: time a fixed calibration workload (about 1 ms on one thread, "
        "kassay.validate.host_calibration) right after every repetition, so that a comparison "
        "with another job that did the same divides out the host's speed (host-normalised: "
        "a shared runner's drift between jobs cancels); costs that workload's time per "
        "repetition. No effect on CUDA",
    )


class ConvergencePolicy(BaseModel):
    """A convergence suite (kassay.validate.convergence): train a small decoder (its shape
    below) `steps` steps with each impl in the op's place, against the baseline with the same
    initial weights and data (matched seeds), over `seeds` seeds, beside a correct alternative
    (`control`: the op's default where unset); the held-out loss differences are judged by
    equivalence within max(margin_sigma x the baseline's seed spread, margin_floor) nats."""

    model_config = _STRICT
    steps: int = Field(400, ge=1, le=100_000)
    seeds: int = Field(4, ge=2, le=64)
    eval_every: int = Field(50, ge=1, le=100_000)
    lr: float = Field(3e-3, gt=0, le=1)
    control: Name | None = None
    margin_sigma: float = Field(0.25, gt=0, le=10)
    margin_floor: float = Field(0.005, ge=0, le=10)
    vocab: int = Field(16, ge=4, le=4096)
    dim: int = Field(32, ge=4, le=4096)
    heads: int = Field(2, ge=1, le=64)
    layers: int = Field(2, ge=1, le=32)
    seq: int = Field(32, ge=4, le=8192)
    batch: int = Field(16, ge=1, le=4096)
    chunks: int = Field(4, ge=2, le=64)
    eval_batch: int = Field(256, ge=2, le=65536)
    #: seeds trained side by side in processes of their own; 0: up to half the host's cores
    #: on a GPU, one on a CPU
    parallel: int = Field(0, ge=0, le=64)

    @model_validator(mode="after")
    def _shape(self) -> ConvergencePolicy:
        if self.dim % self.heads or (self.dim // self.heads) % 2:
            raise ValueError("dim must split into heads of an even head size (RoPE)")
        if self.seq % 2 or self.seq // self.chunks < 1:
            raise ValueError("seq must be even and hold at least one position per chunk")
        return self

    def shape(self) -> dict[str, int]:
        """The model's shape (kassay.validate.convergence.model.Shape's fields)."""
        keys = ("vocab", "dim", "heads", "layers", "seq", "batch", "chunks")
        return {k: getattr(self, k) for k in keys}


class Suite(BaseModel):
    model_config = _STRICT
    op: Name
    impls: list[Name] = Field(min_length=1, max_length=64)
    baseline: Name = "torch"
    params: dict[str, Any] = Field(default_factory=dict, max_length=64)
    # None: every regime of the op
    regimes: list[Name] | None = Field(None, min_length=1, max_length=64)
    seeds: list[Seed] = Field(default_factory=lambda: [0], min_length=1, max_length=100_000)
    # standard: add the edge points of kassay.validate.coverage; none: only the grid
    coverage: Literal["standard", "none"] = "standard"
    tolerance: TolerancePolicy = Field(default_factory=TolerancePolicy)
    timing: TimingPolicy = Field(default_factory=TimingPolicy)
    regression_threshold: float | None = Field(
        None,
        gt=0,
        le=10,
        description="a comparison with an earlier job flags a case of this suite as slower (or "
        "using more memory) when the change is significant and beyond this fraction (0.03: 3%); "
        "unset: the job's compare_to.threshold, else 0.03",
    )
    #: set: a convergence suite (its params are the op's options; regimes, coverage, tolerance
    #: and timing do not apply)
    convergence: ConvergencePolicy | None = None

    @field_validator("impls")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("impls must not repeat a name")
        return v


class CompareTo(BaseModel):
    """What a job is compared with once it is over: a job by id, or the latest finished job
    with the same name, these labels and the same device kind (e.g. `{branch: main}`)."""

    model_config = _STRICT
    job: str | None = Field(None, min_length=1, max_length=40, pattern=r"^[A-Za-z0-9_\-]+$")
    labels: dict[LabelKey, LabelValue] | None = Field(None, max_length=MAX_LABELS)
    threshold: float | None = Field(
        None, gt=0, le=10, description="the regression threshold of suites that set none"
    )

    @model_validator(mode="after")
    def _one_target(self) -> CompareTo:
        if (self.job is None) == (self.labels is None):
            raise ValueError("compare_to needs exactly one of `job` or `labels`")
        return self


class JobSpec(BaseModel):
    model_config = _STRICT
    name: str = Field(min_length=1, max_length=200, pattern=NO_CONTROL)
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=MAX_LABELS)
    suites: list[Suite] = Field(min_length=1, max_length=100)
    max_cases: int | None = Field(None, gt=0, lt=2**63)
    max_duration_s: float | None = Field(
        None,
        gt=0,
        le=7 * 86400,
        description="end the job (unfinished cases: timeout) this long after submission; the "
        "server's KASSAY_MAX_JOB_S caps it",
    )
    compare_to: CompareTo | None = Field(
        None,
        description="compare the job, once over, with this one; the service records the "
        "verdict with the job and its reports include it",
    )
    artifacts: list[Digest] = Field(
        default_factory=list,
        max_length=MAX_ARTIFACTS,
        description="sha256 digests of uploaded artifacts (POST /v1/artifacts) whose "
        "`kassay.impls` entry points provide impls to this job; they run only in a sandboxed "
        "executor, and submitting them needs the `code` scope",
    )

    @field_validator("artifacts")
    @classmethod
    def _unique_artifacts(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("artifacts must not repeat a digest")
        return v


class GroupSpec(BaseModel):
    """One input group: shared inputs and reference, several impls. `params` is the op's
    validated params dump. Sent to workers as is."""

    model_config = _STRICT
    group_id: str
    suite_index: int = 0
    op: str
    params: dict[str, Any]
    regime: str = "normal"
    seed: Seed = 0
    impls: list[str]
    baseline: str = "torch"
    tolerance: TolerancePolicy = Field(default_factory=TolerancePolicy)
    timing: TimingPolicy = Field(default_factory=TimingPolicy)
    coverage: str = ""  # empty: a point of the user's grid; else why coverage added it
    #: the job's artifacts: this group runs only in a sandboxed executor that loaded them
    artifacts: list[Digest] = Field(default_factory=list, max_length=MAX_ARTIFACTS)
    #: non-empty: a grid point the op's params refuse as a combination (dtype x autocast); it
    #: never runs, its cases are reported `skipped` with this reason and `params` is the point
    #: as the suite wrote it
    skip: str = ""
    #: set: a convergence group (regime "convergence"): its impls are trained, not called once
    convergence: ConvergencePolicy | None = None

    def case_ids(self) -> list[str]:
        return [case_id(self.group_id, impl) for impl in self.impls]


def case_id(group_id: str, impl: str) -> str:
    return f"{group_id}:{impl}"


def group_id_of(op: str, params: dict[str, Any], regime: str, seed: int, suite_index: int) -> str:
    key = json.dumps([suite_index, op, params, regime, seed], sort_keys=True, default=str)
    return f"g{suite_index}-{hashlib.sha1(key.encode()).hexdigest()[:12]}"


def parse_spec(data: str | bytes | dict[str, Any], *, json_only: bool = False) -> JobSpec:
    """Parse a job spec from YAML/JSON text (bounded: see kassay.contract.documents) or a dict;
    errors name the field path."""
    raw = load_document(data, json_only=json_only) if isinstance(data, (str, bytes)) else data
    if not isinstance(raw, dict):
        raise InvalidSpecError("job spec must be a mapping with name and suites")
    try:
        return JobSpec.model_validate(raw)
    except ValidationError as exc:
        raise spec_error(exc) from None


def load_spec(path: str | Path) -> JobSpec:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InvalidSpecError(f"cannot read job spec {path}: {exc.strerror}") from None
    return parse_spec(text)


def spec_error(exc: ValidationError, prefix: tuple[Any, ...] = ()) -> InvalidSpecError:
    errors = [
        {"loc": [*prefix, *e["loc"]], "msg": e["msg"], "type": e["type"]} for e in exc.errors()
    ]
    text = "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in errors
    )
    return InvalidSpecError(f"invalid job spec: {text}", details={"errors": errors})


#: the regime a convergence group carries (its case keys apart from the per-call cases'),
#: followed by a digest of its policy (convergence_regime)
CONVERGENCE_REGIME = "convergence"


def convergence_regime(policy: ConvergencePolicy) -> str:
    """`convergence-` and 8 hex digits of the policy (what it trains and how; `parallel` left
    out: it changes no result): two suites training differently never share a case key."""
    text = policy.model_dump_json(exclude={"parallel"})
    return f"{CONVERGENCE_REGIME}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"
