"""Case results: each case's result written once as workers report it (numbered in arrival
order: the SSE event ids), the environments of the workers that ran a job, and the job's report
built from them."""

from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy import Connection, Engine, and_, bindparam, select, text, update

from kassay.api.store.history import index_results
from kassay.api.store.jobs import Jobs
from kassay.api.store.tables import cases, groups, jobs
from kassay.contract.results import CaseResult, Environment, Report, Status, Summary, named
from kassay.contract.spec import GroupSpec
from kassay.validate.case_result import case_result


class _Duplicate(Exception):
    """Raised inside a transaction to roll back a duplicate result."""


class Results:
    """The case results of every job, and the reports made of them."""

    def __init__(self, engine: Engine, jobs: Jobs) -> None:
        self.engine = engine
        self.jobs = jobs

    def record_result(self, job_id: str, result: CaseResult) -> int | None:
        """Write one case result unless the case already has one. Returns the result's
        sequence number within the job (the SSE event id), or None for a duplicate."""
        now = time.time()
        col = jobs.c[result.status]
        try:
            with self.engine.begin() as conn:
                # Take the job's next sequence number (RETURNING), then write the case with it
                # and index it by case key; a case that already has a result rolls all back.
                seq, job_seq = conn.execute(
                    update(jobs)
                    .where(jobs.c.id == job_id)
                    .values({jobs.c.done: jobs.c.done + 1, col: col + 1})
                    .returning(jobs.c.done, jobs.c.seq)
                ).one()
                res = conn.execute(
                    update(cases)
                    .where(
                        and_(
                            cases.c.job_id == job_id,
                            cases.c.case_id == result.case_id,
                            cases.c.status.is_(None),
                        )
                    )
                    .values(
                        status=result.status,
                        result=result.model_dump(mode="json"),
                        finished_at=now,
                        seq=seq,
                    )
                )
                if res.rowcount != 1:
                    raise _Duplicate
                index_results(conn, job_id, job_seq, [result])
        except _Duplicate:
            return None
        return int(seq)

    def add_environment(self, job_id: str, env: dict[str, Any]) -> None:
        """Record a worker environment once per job (deduplicated by device and host)."""
        key = (env.get("hostname"), env.get("device"), env.get("device_name"))
        with self.engine.begin() as conn:
            # locked (PostgreSQL): two replicas adding environments at once would each write
            # back the list they read and lose the other's
            cur = conn.execute(
                select(jobs.c.environments).where(jobs.c.id == job_id).with_for_update()
            ).scalar()
            envs = list(cur or [])
            if any((e.get("hostname"), e.get("device"), e.get("device_name")) == key for e in envs):
                return
            envs.append(env)
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(environments=envs))

    def results_since(self, job_id: str, after: int, limit: int = 500) -> list[tuple[int, dict]]:
        """Results with seq > after, in the order they arrived."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(cases.c.seq, cases.c.result)
                .where(and_(cases.c.job_id == job_id, cases.c.seq > after))
                .order_by(cases.c.seq)
                .limit(limit)
            ).all()
        return [(int(r.seq), r.result) for r in rows]

    def case_results(self, job_id: str) -> list[CaseResult]:
        """Finished cases of a job in expansion order."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(cases.c.result)
                .where(and_(cases.c.job_id == job_id, cases.c.status.is_not(None)))
                .order_by(cases.c.idx)
            ).all()
        return [CaseResult.model_validate(r.result) for r in rows]

    def report(self, job_id: str) -> Report:
        """The job's report as it stands (partial while the job runs)."""
        from datetime import datetime, timezone

        job = self.jobs.require_job(job_id, full=True)
        results = named(self.case_results(job_id))

        def ts(t: float | None) -> datetime | None:
            return datetime.fromtimestamp(t, timezone.utc) if t is not None else None

        created = ts(job.created_at)
        assert created is not None
        return Report(
            job_id=job.id,
            name=job.name,
            labels=job.labels,
            state=job.state,
            created_at=created,
            finished_at=ts(job.finished_at),
            environments=[Environment.model_validate(e) for e in job.environments],
            summary=Summary.of(results, cancelled=job.state == "cancelled"),
            cases=results,
        )

    def fill_missing(self, job_id: str, group_id: str, *, status: str, reason: str) -> None:
        """Give every case of the group still without a result `status` with `reason`."""
        with self.engine.connect() as conn:
            missing = conn.execute(
                select(cases.c.impl, cases.c.dtype)
                .where(
                    and_(
                        cases.c.job_id == job_id,
                        cases.c.group_id == group_id,
                        cases.c.status.is_(None),
                    )
                )
                .order_by(cases.c.idx)
            ).all()
            if not missing:  # the usual case: every result arrived; skip decoding the spec
                return
            g = conn.execute(
                select(groups.c.spec).where(
                    and_(groups.c.job_id == job_id, groups.c.group_id == group_id)
                )
            ).first()
        if g is None:
            return
        spec = GroupSpec.model_validate(g.spec)
        for m in missing:
            self.record_result(
                job_id,
                case_result(spec, m.impl, status, reason, dtype=m.dtype),  # type: ignore[arg-type]
            )

    def fill_job_missing(
        self, conn: Connection, job_id: str, *, status: Status, reason: str
    ) -> int:
        """Inside the caller's transaction: give every case of the job still without a result
        `status` with `reason`, numbered after the job's results so far, in a handful of
        statements whatever the number of cases (cancelling 10,000 cases is one batch). The
        caller holds the job row (it updated it first), so no result can slip in between."""
        done, job_seq, envs = conn.execute(
            select(jobs.c.done, jobs.c.seq, jobs.c.environments).where(jobs.c.id == job_id)
        ).one()
        missing = conn.execute(
            select(cases.c.case_id, cases.c.group_id, cases.c.impl, cases.c.dtype)
            .where(and_(cases.c.job_id == job_id, cases.c.status.is_(None)))
            .order_by(cases.c.idx)
        ).all()
        if not missing:
            return 0
        specs = {
            r.group_id: GroupSpec.model_validate(r.spec)
            for r in conn.execute(
                select(groups.c.group_id, groups.c.spec).where(
                    and_(
                        groups.c.job_id == job_id,
                        groups.c.group_id.in_({m.group_id for m in missing}),
                    )
                )
            )
        }
        now = time.time()
        results = [
            case_result(specs[m.group_id], m.impl, status, reason, dtype=m.dtype) for m in missing
        ]
        rows = [
            {"k_case": r.case_id, "result": r.model_dump(mode="json"), "seq": done + i}
            for i, r in enumerate(results, start=1)
        ]
        if conn.dialect.name == "postgresql":
            _fill_from_arrays(conn, job_id, rows, status=status, now=now)
        else:
            conn.execute(
                update(cases)
                .where(
                    and_(
                        cases.c.job_id == job_id,
                        cases.c.case_id == bindparam("k_case"),
                        cases.c.status.is_(None),
                    )
                )
                .values(
                    status=status,
                    result=bindparam("result"),
                    finished_at=now,
                    seq=bindparam("seq"),
                ),
                rows,
            )
        index_results(conn, job_id, job_seq, results, envs or [])
        col = jobs.c[status]
        conn.execute(
            update(jobs)
            .where(jobs.c.id == job_id)
            .values({jobs.c.done: jobs.c.done + len(rows), col: col + len(rows)})
        )
        return len(rows)


_FILL_FROM_ARRAYS = text(
    "UPDATE cases SET status = :status, result = v.result, finished_at = :now, seq = v.seq "
    "FROM unnest(CAST(:case_ids AS text[]), CAST(:results AS json[]), CAST(:seqs AS integer[])) "
    "AS v(case_id, result, seq) "
    "WHERE cases.job_id = :job_id AND cases.case_id = v.case_id AND cases.status IS NULL"
)


def _fill_from_arrays(
    conn: Connection, job_id: str, rows: list[dict[str, Any]], *, status: str, now: float
) -> None:
    """PostgreSQL: the bulk fill of fill_job_missing as one UPDATE ... FROM unnest(arrays):
    three array parameters whatever the number of cases (an executemany of 10,000 UPDATEs,
    even pipelined, takes seconds; so does compiling a 10,000-row VALUES)."""
    conn.execute(
        _FILL_FROM_ARRAYS,
        {
            "status": status,
            "now": now,
            "job_id": job_id,
            "case_ids": [r["k_case"] for r in rows],
            "results": [json.dumps(r["result"]) for r in rows],
            "seqs": [r["seq"] for r in rows],
        },
    )
