"""The history page's data: one case key's results over jobs (oldest first) as plot points, each
judged against the point before it with the comparison's own rules (kassay.validate.compare_reports):
a newly failing status, a slowdown beyond the threshold whose confidence interval is above 1,
an error grown beyond factor x + floor, more peak memory. Those points are regressions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kassay.contract.comparison import DEFAULT_THRESHOLD
from kassay.contract.results import BAD_STATUSES, CaseResult, Report
from kassay.validate.compare_reports import (
    accuracy_changes,
    case_key,
    job_device_kinds,
    key_parts,
    memory_change,
    speed_change,
    status_change,
)
from kassay.validate.median_ratio import DEFAULT_CONFIDENCE

#: the tolerance factor of suites that set none (kassay.contract.spec's default)
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


#: statuses that count as broken on the history overview
BROKEN = BAD_STATUSES


def broken_since(reports: Sequence[Report], regressed: Sequence[set[str]]) -> list[dict[str, Any]]:
    """The overview of a labelled series: every case key broken in its latest job (a status in
    BROKEN, or a regression of that job's comparison), with the job where the break started (the
    oldest of the unbroken-free run that ends at the latest).

    reports: the series' finished jobs' reports, newest first; regressed: per report, the case
    keys its comparison found regressed. Returns one row per key: key, name, what (status or
    "regression"), since (point label), since_job, jobs (how many in a row)."""
    if not reports:
        return []
    broken_by_job: list[dict[str, CaseResult]] = []
    for report, reg in zip(reports, regressed, strict=True):
        keyed = keyed_choices(report, job_device_kinds(report))
        broken_by_job.append({k: c for k, c in keyed if c.status in BROKEN or k in reg})
    rows = []
    latest = reports[0]
    names = {c.case_id: c.name for c in latest.cases}
    for key, case in broken_by_job[0].items():
        run = 1
        while run < len(reports) and key in broken_by_job[run]:
            run += 1
        first = reports[run - 1]
        rows.append(
            {
                "key": key,
                "name": names.get(case.case_id) or f"{case.op}.{case.impl} {case.label()}",
                "what": case.status if case.status in BROKEN else "regression",
                "since": point_label(first.labels, first.job_id or ""),
                "since_job": first.job_id,
                "jobs": run,
                "all": run == len(reports),
            }
        )
    rows.sort(key=lambda r: (-int(r["jobs"] or 0), str(r["name"])))
    return rows
