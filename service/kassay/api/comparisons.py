"""Comparisons for the API: which job a request (or a job's compare_to) means, the comparison,
and the verdict recorded with a job whose spec asks for one.

A job named by labels is the latest finished job with the same name, those labels and the same
device kind, finished before the compared job (when that one is over): a verdict computed on the
first read after the job ends names the same job as one computed the moment it ended, so it is
recorded once, on first read (of the report or the comparison), whichever API replica serves it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import IntegrityError

from kassay.api.store import ACTIVE_STATES, JobRecord, Store
from kassay.contract.comparison import Comparison
from kassay.contract.results import Report
from kassay.errors import IncomparableError, InvalidSpecError, NotFoundError
from kassay.validate.compare_reports import compare_reports, job_device_kinds


@dataclass(frozen=True)
class Target:
    """What to compare with: a job id, or labels."""

    job: str | None = None
    labels: Mapping[str, str] | None = None

    def describe(self) -> str:
        if self.job:
            return f"job {self.job}"
        return "labels " + ", ".join(f"{k}={v}" for k, v in (self.labels or {}).items())


def _target_of_spec(job: JobRecord) -> tuple[Target, float | None] | None:
    ct = job.spec.get("compare_to")
    if not ct:
        return None
    return Target(job=ct.get("job"), labels=ct.get("labels")), ct.get("threshold")


def resolve(store: Store, job: JobRecord, report: Report, target: Target) -> JobRecord:
    """The job `target` means for `job`; NotFoundError when none matches."""
    if target.job:
        return store.jobs.require_job(target.job)
    kinds = job_device_kinds(report)
    found = store.history.latest_matching(job, labels=target.labels or {}, kinds=kinds)
    if found is None:
        where = f" on {', '.join(kinds)}" if kinds else ""
        before = " that finished before it" if job.finished_at is not None else ""
        raise NotFoundError(
            f"nothing to compare job {job.id} with: no finished job named {job.name!r} with "
            f"{target.describe()}{where}{before}",
            details={"job_id": job.id, "labels": dict(target.labels or {}), "device_kinds": kinds},
        )
    return found


def compare(
    store: Store,
    job_id: str,
    *,
    to: str | None = None,
    to_labels: Mapping[str, str] | None = None,
    threshold: float | None = None,
) -> Comparison:
    """Job `job_id` against `to` (an id) or the job `to_labels` means; with neither, the
    verdict its spec's compare_to asks for (recorded once the job is over). `threshold`: for
    suites that set none."""
    if to and to_labels:
        raise InvalidSpecError(
            "compare with one job: pass `to` or `to_labels`, not both",
            details={"errors": [{"loc": ["query", "to"], "msg": "to and to_labels both set"}]},
        )
    job = store.jobs.require_job(job_id, full=True)
    if not to and not to_labels:
        spec_target = _target_of_spec(job)
        if spec_target is None:
            raise InvalidSpecError(
                f"say what to compare job {job_id} with: ?to=JOB_ID or ?to_labels=KEY=VALUE "
                "(its spec has no compare_to)",
                details={"errors": [{"loc": ["query", "to"], "msg": "missing"}]},
            )
        if threshold is None:
            comparison, note = verdict(store, job)
            if comparison is None:
                raise NotFoundError(note, details={"job_id": job_id})
            return comparison
        target, _ = spec_target
    else:
        target = Target(job=to, labels=to_labels)
    report = store.results.report(job_id)
    other = resolve(store, job, report, target)
    return compare_reports(
        report, store.results.report(other.id), spec=job.spec, threshold=_threshold(job, threshold)
    )


def _threshold(job: JobRecord, asked: float | None) -> float | None:
    if asked is not None:
        return asked
    spec_target = _target_of_spec(job)
    return spec_target[1] if spec_target else None


def verdict(
    store: Store, job: JobRecord, report: Report | None = None
) -> tuple[Comparison | None, str]:
    """The comparison the job's compare_to asks for, and why there is none when there is none.
    Recorded with the job the first time it is asked for once the job (and a job named by id)
    is over."""
    spec_target = _target_of_spec(job)
    if spec_target is None:
        return None, "the job's spec has no compare_to"
    recorded, comparison, note = store.history.recorded_comparison(job.id)
    if recorded:
        return comparison, note
    if job.state in ACTIVE_STATES:
        return None, f"job {job.id} is not over yet: it is compared once it is"
    target, threshold = spec_target
    report = report or store.results.report(job.id)
    try:
        other = resolve(store, job, report, target)
        if other.state in ACTIVE_STATES:
            return None, f"job {other.id} (compare_to) is not over yet"
        comparison = compare_reports(
            report, store.results.report(other.id), spec=job.spec, threshold=threshold
        )
        note = ""
    except (NotFoundError, IncomparableError) as exc:
        comparison, note = None, exc.message
    try:
        store.history.save_comparison(job.id, comparison, note=note)
    except IntegrityError:  # another replica recorded it first: read theirs
        _, comparison, note = store.history.recorded_comparison(job.id)
    return comparison, note


def report_with_verdict(store: Store, job_id: str) -> Report:
    """The job's report, with the comparison its spec's compare_to asks for when there is one."""
    report = store.results.report(job_id)
    job = store.jobs.require_job(job_id, full=True)
    if _target_of_spec(job) is not None:
        report.comparison, _ = verdict(store, job, report)
        wanted = (job.spec.get("compare_to") or {}).get("labels")
        if report.comparison is not None and wanted:
            # the series the spec compares with (e.g. branch=main), not the matched job's labels
            _mark_broken_since(store, report, dict(wanted))
    return report


#: how many of the compared series' latest jobs are read to find where a break started
SINCE_DEPTH = 10


def series_breaks(
    store: Store, labels: dict[str, str], depth: int, *, skip_job: str | None = None
) -> tuple[list[JobRecord], list[dict[str, Any]]]:
    """The latest `depth` finished jobs with `labels` (newest first, `skip_job` left out) and
    every case key broken in the newest of them, with where its run of breaks started
    (kassay.api.history_view.broken_since): the history page's overview and a report's
    `broken_since` read it alike."""
    from kassay.api.history_view import broken_since

    jobs = [
        j
        for j in store.jobs.list_jobs(state="finished", labels=labels, limit=depth + 1)
        if j.id != skip_job
    ][:depth]
    if not jobs:
        return [], []
    regressed = []
    for j in jobs:
        _has, comp, _note = store.history.recorded_comparison(j.id)
        regressed.append({c.key for c in comp.cases if c.regression} if comp else set())
    return jobs, broken_since([store.results.report(j.id) for j in jobs], regressed)


def _mark_broken_since(store: Store, report: Report, labels: dict[str, str]) -> None:
    """Set `broken_since` on each case of `report` that does not pass and whose key is broken
    in the latest job of the series with `labels` too: where that run of breaks started."""
    from kassay.api.history_view import BROKEN, keyed_choices

    bad = {c.case_id for c in report.cases if c.status in BROKEN}
    if not bad:
        return
    _jobs, rows = series_breaks(store, labels, SINCE_DEPTH, skip_job=report.job_id)
    since = {r["key"]: str(r["since"]) for r in rows}
    for key, case in keyed_choices(report, job_device_kinds(report)):
        if case.case_id in bad and key in since:
            case.broken_since = since[key]
