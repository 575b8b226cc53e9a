"""History: case results indexed by case key across jobs, the job a comparison is made with,
recorded comparison verdicts, and the series of one case key over jobs (for plots)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Engine, and_, insert, select
from sqlalchemy.exc import IntegrityError

from kassay.api.store.jobs import JobRecord, label_filters
from kassay.api.store.tables import case_keys, cases, comparisons, jobs
from kassay.contract.comparison import Comparison
from kassay.contract.results import CaseResult
from kassay.validate.compare_reports import case_key, device_kind, key_parts

#: how many of the newest jobs with a name and labels a comparison looks through for one on the
#: same device kind
MAX_CANDIDATES = 200
SERIES_METRICS = ("device_median_ms", "rel_l2", "peak_bytes")


def _kinds(environments: Sequence[Mapping[str, Any]]) -> list[str]:
    return sorted({device_kind(e) for e in environments} - {""})


def index_results(
    conn: Connection,
    job_id: str,
    job_seq: int,
    results: Sequence[CaseResult],
    environments: Sequence[Mapping[str, Any]] | None = None,
) -> None:
    """Inside the caller's transaction: index results by case key. A result without an
    environment (a case that never ran) takes the job's device kind when it has one kind;
    `environments` is read from the job when not given and needed."""
    if not results:
        return
    if environments is None and any(r.environment is None for r in results):
        environments = conn.execute(
            select(jobs.c.environments).where(jobs.c.id == job_id)
        ).scalar_one()
    kinds = _kinds(environments or [])
    fallback = kinds[0] if len(kinds) == 1 else ""
    conn.execute(
        insert(case_keys),
        [
            {
                "job_id": job_id,
                "case_id": r.case_id,
                "key": case_key(key_parts(r, fallback)),
                "job_seq": job_seq,
            }
            for r in results
        ],
    )


class History:
    """Reads across jobs: comparison targets, recorded comparisons, series."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def latest_matching(
        self, job: JobRecord, *, labels: Mapping[str, str], kinds: Sequence[str]
    ) -> JobRecord | None:
        """The latest finished job other than `job` with its name, `labels` and a device kind in
        `kinds` (any, when empty), that finished before `job` did (when `job` is over): so a
        verdict recorded later names the same job as one recorded at once."""
        from kassay.api.store.jobs import _SUMMARY, _record

        q = (
            select(*_SUMMARY, jobs.c.environments)
            .where(
                and_(
                    jobs.c.name == job.name,
                    jobs.c.state == "finished",
                    jobs.c.id != job.id,
                    *label_filters(labels),
                )
            )
            .order_by(jobs.c.finished_at.desc(), jobs.c.seq.desc())
            .limit(MAX_CANDIDATES)
        )
        if job.finished_at is not None:
            q = q.where(jobs.c.finished_at <= job.finished_at)
        with self.engine.connect() as conn:
            rows = conn.execute(q).all()
        for r in rows:
            theirs = _kinds(r.environments or [])
            if not kinds or not theirs or set(kinds) & set(theirs):
                return _record(r)
        return None

    def save_comparison(
        self, job_id: str, comparison: Comparison | None, *, note: str = ""
    ) -> None:
        """Record a job's verdict once (a second write for the same job is ignored)."""
        row = {
            "job_id": job_id,
            "to_job_id": comparison.to_job_id if comparison else None,
            "created_at": time.time(),
            "result": comparison.model_dump(mode="json") if comparison else None,
            "note": note,
        }
        try:
            with self.engine.begin() as conn:
                exists = conn.execute(
                    select(comparisons.c.job_id).where(comparisons.c.job_id == job_id)
                ).first()
                if exists is None:
                    conn.execute(insert(comparisons).values(**row))
        except IntegrityError:  # another replica recorded it between the check and the insert
            pass

    def recorded_comparison(self, job_id: str) -> tuple[bool, Comparison | None, str]:
        """(recorded?, the comparison or None when nothing matched, the note)."""
        with self.engine.connect() as conn:
            row = conn.execute(
                select(comparisons.c.result, comparisons.c.note).where(
                    comparisons.c.job_id == job_id
                )
            ).first()
        if row is None:
            return False, None, ""
        result = Comparison.model_validate(row.result) if row.result is not None else None
        return True, result, row.note or ""

    def regression_counts(self, job_ids: list[str]) -> dict[str, int | None]:
        """For the jobs among `job_ids` that recorded a comparison: its regression count (None:
        nothing matched to compare with). One query for a page of jobs."""
        if not job_ids:
            return {}
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(comparisons.c.job_id, comparisons.c.result).where(
                    comparisons.c.job_id.in_(job_ids)
                )
            ).all()
        return {
            r.job_id: (int(r.result["summary"]["regressions"]) if r.result is not None else None)
            for r in rows
        }

    def series(
        self,
        key: str,
        *,
        labels: Mapping[str, str] | None = None,
        limit: int = 100,
    ) -> list[dict[str, Any]]:
        """The last `limit` finished jobs' results for `key`, oldest first: each a dict with
        the job's id, name, labels, times and the case result."""
        q = (
            select(
                case_keys.c.job_id,
                case_keys.c.job_seq,
                cases.c.result,
                jobs.c.name,
                jobs.c.labels,
                jobs.c.created_at,
                jobs.c.finished_at,
            )
            .select_from(
                case_keys.join(
                    cases,
                    and_(
                        cases.c.job_id == case_keys.c.job_id,
                        cases.c.case_id == case_keys.c.case_id,
                    ),
                ).join(jobs, jobs.c.id == case_keys.c.job_id)
            )
            .where(
                and_(
                    case_keys.c.key == key,
                    jobs.c.state == "finished",
                    cases.c.status.is_not(None),
                    *label_filters(labels or {}),
                )
            )
            .order_by(case_keys.c.job_seq.desc())
            .limit(limit)
        )
        with self.engine.connect() as conn:
            rows = conn.execute(q).all()
        return [
            {
                "job_id": r.job_id,
                "name": r.name,
                "labels": r.labels or {},
                "created_at": r.created_at,
                "finished_at": r.finished_at,
                "result": CaseResult.model_validate(r.result),
            }
            for r in reversed(rows)
        ]
