"""The history page's data: one case key's results over jobs (oldest first) as plot points, each
judged against the point before it with the comparison's own rules (kassay.validate.compare):
a newly failing status, a slowdown beyond the threshold whose confidence interval is above 1,
an error grown beyond factor x + floor, more peak memory. Those points are regressions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kassay.validate.compare import (
    accuracy_changes,
    case_key,
    key_parts,
    memory_change,
    speed_change,
    status_change,
)
from kassay.validate.comparison import DEFAULT_THRESHOLD
from kassay.validate.median_ratio import DEFAULT_CONFIDENCE
from kassay.validate.results import CaseResult, Report

#: the tolerance factor of suites that set none (kassay.validate.spec's default)
DEFAULT_FACTOR = 2.0
METRICS = ("device_median_ms", "rel_l2", "peak_bytes")


def point_label(labels: Mapping[str, str], job_id: str) -> str:
    """The x label of a point: the commit (short) when the job has one, else the job id."""
    commit = labels.get("commit") or labels.get("sha") or labels.get("git_sha")
    return commit[:10] if commit else job_id


def _values(c: CaseResult) -> dict[str, float | None]:
    t, m = c.timing, c.memory
    errs = [o.rel_l2 for o in c.outputs if o.rel_l2 == o.rel_l2]
    return {
        "device_median_ms": t.median_ms if t else None,
        "low": t.p10_ms if t else None,
        "high": t.p90_ms if t else None,
        "rel_l2": max(errs) if errs else None,
        "peak_bytes": float(m.peak_extra_bytes) if m and m.peak_extra_bytes is not None else None,
    }


def judge(
    new: CaseResult, old: CaseResult | None, *, threshold: float, factor: float
) -> tuple[dict[str, bool], list[str]]:
    """Which metrics regressed from `old` to `new` (a newly failing case marks all three),
    and why, one line each."""
    regressed = dict.fromkeys(METRICS, False)
    reasons: list[str] = []
    if old is None:
        return regressed, reasons
    if status_change(old.status, new.status) == "newly_failing":
        regressed = dict.fromkeys(METRICS, True)
        reasons.append(f"newly failing: {old.status} -> {new.status}")
    if new.timing and old.timing:
        s = speed_change(new.timing, old.timing, threshold, DEFAULT_CONFIDENCE)
        if s is not None and s.verdict == "slower":
            regressed["device_median_ms"] = True
            reasons.append(
                f"slower: x{s.ratio:.3f} ({s.confidence:.0%} CI {s.low:.3f}-{s.high:.3f}) "
                f"over +{threshold:.1%}"
            )
    for a in accuracy_changes(new.outputs, old.outputs, factor):
        if a.change == "worse":
            regressed["rel_l2"] = True
            reasons.append(f"less accurate: {a.output} {a.metric} {a.before:.3g} -> {a.after:.3g}")
    m = memory_change(new, old, threshold)
    if m is not None and m.verdict == "more":
        regressed["peak_bytes"] = True
        reasons.append(f"more memory: {m.before_bytes} -> {m.after_bytes} bytes")
    return regressed, reasons


def series_points(
    rows: Sequence[Mapping[str, Any]],
    *,
    threshold: float = DEFAULT_THRESHOLD,
    factor: float = DEFAULT_FACTOR,
) -> list[dict[str, Any]]:
    """Plot points from History.series rows (oldest first)."""
    out: list[dict[str, Any]] = []
    prev: CaseResult | None = None
    for row in rows:
        c: CaseResult = row["result"]
        regressed, reasons = judge(c, prev, threshold=threshold, factor=factor)
        out.append(
            {
                "job_id": row["job_id"],
                "x": point_label(row["labels"], row["job_id"]),
                "labels": row["labels"],
                "status": c.status,
                "regressed": regressed,
                "regression": any(regressed.values()),
                "reasons": reasons,
                **_values(c),
            }
        )
        prev = c
    return out


def keyed_choices(report: Report, kinds: Sequence[str]) -> list[tuple[str, CaseResult]]:
    """(case key, case) of every case of a job: what the history page offers to pick from."""
    fallback = kinds[0] if len(kinds) == 1 else ""
    return [(case_key(key_parts(c, fallback)), c) for c in report.cases]
