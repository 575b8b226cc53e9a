"""The job store: jobs, input groups and case results in any SQLAlchemy database.

SQLite (a file, WAL journal) by default; PostgreSQL or any other SQLAlchemy URL by setting.
Results persist one by one as workers report them. A case's result is written at most once (the
update only touches a row whose status is still NULL), so a group re-run after a lost worker or
a restarted API never duplicates a case, and never re-runs one: the dispatcher sends only the
impls of a group that have no result yet.

Every method is synchronous and short; the async dispatcher calls them through a thread.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    String,
    and_,
    bindparam,
    create_engine,
    event,
    func,
    insert,
    select,
    true,
    type_coerce,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import ColumnElement

from kassay.api.tables import STATUS_COLUMNS, cases, groups, job_labels, jobs, metadata
from kassay.errors import ConflictError, NotFoundError
from kassay.validate.results import CaseResult, Environment, Report, Summary
from kassay.validate.spec import GroupSpec, JobSpec

JOB_STATES = ("queued", "running", "finished", "cancelled")
ACTIVE_STATES = ("queued", "running")


@dataclass
class JobRecord:
    """One job as stored, with its progress counters."""

    seq: int
    id: str
    name: str
    state: str
    labels: dict[str, str]
    created_at: float
    started_at: float | None
    finished_at: float | None
    total: int
    done: int
    counts: dict[str, int]
    cancel_requested: bool
    spec: dict[str, Any] = field(repr=False)
    environments: list[dict[str, Any]] = field(repr=False)

    @property
    def ok(self) -> bool | None:
        """True/False once the job is over; None while it runs."""
        if self.state in ACTIVE_STATES:
            return None
        c = self.counts
        return not (c["failed"] or c["error"] or c["crashed"] or c["timeout"]) and (
            self.state == "finished"
        )


@dataclass
class Claim:
    """An input group leased to one worker: the impls still to run and the attempt number."""

    job_id: str
    group: GroupSpec
    attempt: int


def new_job_id() -> str:
    return "job_" + secrets.token_hex(8)


def body_hash(data: bytes | str) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return hashlib.sha256(raw).hexdigest()


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def make_engine(url: str) -> Engine:
    """An engine for `url`; for SQLite, create the file's folder and switch on WAL."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1] if "///" in url else ""
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 10})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True)


#: the columns of a job's state and progress (not its spec and environments: big JSON)
_SUMMARY = [
    c for c in jobs.c if c.name not in ("spec", "environments", "body_hash", "idempotency_key")
]


# Built once: constructing a 20-column select costs more than running it on SQLite.
_GET_JOB = select(*_SUMMARY).where(jobs.c.id == bindparam("job_id"))
_GET_JOB_FULL = select(jobs).where(jobs.c.id == bindparam("job_id"))


_FAST_SQL = f"SELECT {', '.join(c.name for c in _SUMMARY)} FROM jobs WHERE id = ?"


@dataclass
class _Mapped:
    """A dict dressed as a SQLAlchemy row for _record."""

    _mapping: dict[str, Any]


def _record(row: Any) -> JobRecord:
    m = row._mapping
    return JobRecord(
        seq=m["seq"],
        id=m["id"],
        name=m["name"],
        state=m["state"],
        labels=m["labels"] or {},
        created_at=m["created_at"],
        started_at=m["started_at"],
        finished_at=m["finished_at"],
        total=m["total"],
        done=m["done"],
        counts={s: m[s] for s in STATUS_COLUMNS},
        cancel_requested=bool(m["cancel_requested"]),
        spec=m.get("spec") or {},
        environments=m.get("environments") or [],
    )


def _leased_by(job_id: str, group_id: str, owner: str) -> ColumnElement[bool]:
    """The group, while `owner` (an API process) holds its lease."""
    return and_(
        groups.c.job_id == job_id,
        groups.c.group_id == group_id,
        groups.c.state == "leased",
        groups.c.owner == owner,
    )


class _Duplicate(Exception):
    """Raised inside a transaction to roll back a duplicate result."""


class Store:
    """Jobs, groups and cases in one database."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        metadata.create_all(self.engine)
        # SQLite file: the hot read (a job's state by id) uses a plain sqlite3 connection per
        # thread, ~10x cheaper than going through SQLAlchemy's pool and compiler.
        path = url.split("///", 1)[1] if url.startswith("sqlite:///") else ""
        self._sqlite_path = path if path and path != ":memory:" else None
        self._local = threading.local()

    def close(self) -> None:
        self.engine.dispose()

    def ping(self) -> bool:
        with self.engine.connect() as conn:
            conn.execute(select(1)).scalar()
        return True

    # ------------------------------------------------------------------ jobs

    def create_job(
        self,
        spec: JobSpec,
        group_specs: Sequence[GroupSpec],
        case_dtypes: dict[str, str],
        *,
        idempotency_key: str | None = None,
        spec_hash: str | None = None,
    ) -> tuple[JobRecord, bool]:
        """Store a validated, expanded job. Returns (job, created); with an idempotency key
        already used for the same spec, returns the existing job and False (a different spec
        under the same key is a ConflictError)."""
        if idempotency_key:
            existing = self.find_by_key(idempotency_key, spec_hash)
            if existing is not None:
                return existing, False
        job_id = new_job_id()
        now = time.time()
        n_cases = sum(len(g.impls) for g in group_specs)
        try:
            with self.engine.begin() as conn:
                res = conn.execute(
                    insert(jobs).values(
                        id=job_id,
                        name=spec.name,
                        state="queued",
                        labels=dict(spec.labels),
                        spec=spec.model_dump(mode="json"),
                        idempotency_key=idempotency_key,
                        body_hash=spec_hash,
                        created_at=now,
                        total=n_cases,
                        done=0,
                        cancel_requested=False,
                        environments=[],
                        **{s: 0 for s in STATUS_COLUMNS},
                    )
                )
                seq = res.inserted_primary_key[0] if res.inserted_primary_key else None
                if spec.labels:
                    conn.execute(
                        insert(job_labels),
                        [{"job_id": job_id, "key": k, "value": v} for k, v in spec.labels.items()],
                    )
                if group_specs:
                    conn.execute(
                        insert(groups),
                        [
                            {
                                "job_id": job_id,
                                "group_id": g.group_id,
                                "job_seq": seq,
                                "idx": gi,
                                "spec": g.model_dump(mode="json"),
                                "state": "pending",
                                "attempts": 0,
                            }
                            for gi, g in enumerate(group_specs)
                        ],
                    )
                    rows: list[dict[str, Any]] = []
                    for g in group_specs:
                        for impl in g.impls:
                            rows.append(
                                {
                                    "job_id": job_id,
                                    "case_id": f"{g.group_id}:{impl}",
                                    "idx": len(rows),
                                    "group_id": g.group_id,
                                    "impl": impl,
                                    "dtype": case_dtypes.get(g.group_id, "float32"),
                                }
                            )
                    conn.execute(insert(cases), rows)
                else:
                    conn.execute(
                        update(jobs)
                        .where(jobs.c.id == job_id)
                        .values(state="finished", finished_at=now)
                    )
        except IntegrityError:
            if idempotency_key:  # a concurrent request with the same key won the race
                existing = self.find_by_key(idempotency_key, spec_hash)
                if existing is not None:
                    return existing, False
            raise
        job = self.get_job(job_id)
        assert job is not None
        return job, True

    def find_by_key(self, key: str, spec_hash: str | None) -> JobRecord | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(jobs).where(jobs.c.idempotency_key == key)).first()
        if row is None:
            return None
        if spec_hash and row._mapping["body_hash"] and row._mapping["body_hash"] != spec_hash:
            raise ConflictError(
                "this Idempotency-Key was already used for a different job spec",
                details={"idempotency_key": key, "job_id": row._mapping["id"]},
            )
        return _record(row)

    def _fast_get(self, job_id: str) -> JobRecord | None:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self._sqlite_path or "", check_same_thread=False)
            conn.execute("PRAGMA busy_timeout=10000")
            conn.row_factory = sqlite3.Row
            self._local.conn = conn
        row = conn.execute(_FAST_SQL, (job_id,)).fetchone()
        if row is None:
            return None
        m = dict(row)
        m["labels"] = json.loads(m["labels"]) if m["labels"] else {}
        return _record(_Mapped(m))

    def get_job(self, job_id: str, *, full: bool = False) -> JobRecord | None:
        """A job's state and progress; `full` adds its spec and environments."""
        if not full and self._sqlite_path:
            return self._fast_get(job_id)
        with self.engine.connect() as conn:
            row = conn.execute(_GET_JOB_FULL if full else _GET_JOB, {"job_id": job_id}).first()
        return _record(row) if row is not None else None

    def require_job(self, job_id: str, *, full: bool = False) -> JobRecord:
        job = self.get_job(job_id, full=full)
        if job is None:
            raise NotFoundError(f"no job {job_id!r}", details={"job_id": job_id})
        return job

    def list_jobs(
        self,
        *,
        state: str | None = None,
        labels: dict[str, str] | None = None,
        name: str | None = None,
        limit: int = 50,
        before: int | None = None,
    ) -> list[JobRecord]:
        """Newest first; `before` is the seq cursor of the last job of the previous page."""
        q = select(*_SUMMARY).order_by(jobs.c.seq.desc()).limit(limit)
        if state:
            q = q.where(jobs.c.state == state)
        if name:
            q = q.where(jobs.c.name == name)
        if before is not None:
            q = q.where(jobs.c.seq < before)
        for k, v in (labels or {}).items():
            q = q.where(
                select(job_labels.c.job_id)
                .where(
                    and_(
                        job_labels.c.job_id == jobs.c.id,
                        job_labels.c.key == k,
                        job_labels.c.value == v,
                    )
                )
                .exists()
            )
        with self.engine.connect() as conn:
            return [_record(r) for r in conn.execute(q)]

    def active_job_ids(self) -> list[str]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(jobs.c.id).where(jobs.c.state.in_(ACTIVE_STATES)))
            return [r[0] for r in rows]

    def queue_depth(self) -> int:
        with self.engine.connect() as conn:
            return int(
                conn.execute(
                    select(func.count()).select_from(groups).where(groups.c.state == "pending")
                ).scalar()
                or 0
            )

    # ---------------------------------------------------------------- groups

    def claim_groups(
        self,
        n: int,
        *,
        worker: str,
        owner: str,
        lease_s: float,
        impls: set[str] | None = None,
        share: int = 1,
    ) -> list[Claim]:
        """Lease up to `n` pending groups to `worker`, all of the oldest queued job's.

        `share` is how many workers are taking from the queue: a claim then takes at most its
        fair part of the job's pending groups (rounded up), so one worker does not batch away
        a job while the others idle."""
        first = self.claim_group(worker=worker, owner=owner, lease_s=lease_s, impls=impls)
        if first is None:
            return []
        if share > 1 and n > 1:
            with self.engine.connect() as conn:
                pending = conn.execute(
                    select(func.count())
                    .select_from(groups)
                    .where(and_(groups.c.job_id == first.job_id, groups.c.state == "pending"))
                ).scalar_one()
            n = min(n, max(1, -(-(pending + 1) // share)))
        claims = [first]
        while len(claims) < n:
            more = self.claim_group(
                worker=worker, owner=owner, lease_s=lease_s, impls=impls, job_id=first.job_id
            )
            if more is None:
                break
            claims.append(more)
        return claims

    def claim_group(
        self,
        *,
        worker: str,
        owner: str,
        lease_s: float,
        impls: set[str] | None = None,
        job_id: str | None = None,
    ) -> Claim | None:
        """Lease the oldest pending group to `worker`; None when nothing is queued.
        `impls` (what the worker offers, None = anything) skips groups it cannot run;
        `job_id` restricts the claim to one job."""
        for _ in range(20):  # another dispatcher may win the same row: try the next one
            with self.engine.connect() as conn:
                rows = conn.execute(
                    select(
                        groups.c.job_id,
                        groups.c.group_id,
                        # raw text: only the specs looked at below are decoded
                        type_coerce(groups.c.spec, String).label("spec"),
                        groups.c.attempts,
                    )
                    .where(
                        and_(
                            groups.c.state == "pending",
                            groups.c.job_id == job_id if job_id is not None else true(),
                        )
                    )
                    .order_by(groups.c.job_seq, groups.c.idx)
                    .limit(50)
                ).all()
            if not rows:
                return None
            picked = None
            for r in rows:
                raw = r.spec
                spec = GroupSpec.model_validate(json.loads(raw) if isinstance(raw, str) else raw)
                if impls is None or set(spec.impls) <= impls:
                    picked = (r, spec)
                    break
            if picked is None:
                return None
            r, spec = picked
            now = time.time()
            with self.engine.begin() as conn:
                res = conn.execute(
                    update(groups)
                    .where(
                        and_(
                            groups.c.job_id == r.job_id,
                            groups.c.group_id == r.group_id,
                            groups.c.state == "pending",
                        )
                    )
                    .values(
                        state="leased",
                        worker=worker,
                        owner=owner,
                        attempts=r.attempts + 1,
                        lease_expires_at=now + lease_s,
                    )
                )
                if res.rowcount != 1:
                    continue
                conn.execute(
                    update(jobs)
                    .where(and_(jobs.c.id == r.job_id, jobs.c.state == "queued"))
                    .values(state="running", started_at=now)
                )
                done = {
                    row[0]
                    for row in conn.execute(
                        select(cases.c.impl).where(
                            and_(
                                cases.c.job_id == r.job_id,
                                cases.c.group_id == r.group_id,
                                cases.c.status.is_not(None),
                            )
                        )
                    )
                }
            remaining = [i for i in spec.impls if i not in done]
            if not remaining:  # every case already reported (e.g. before a restart)
                self.finish_group(r.job_id, r.group_id, reason="")
                continue
            return Claim(r.job_id, spec.model_copy(update={"impls": remaining}), r.attempts + 1)
        return None

    def renew_leases(self, keys: Iterable[tuple[str, str]], *, owner: str, lease_s: float) -> None:
        until = time.time() + lease_s
        with self.engine.begin() as conn:
            for job_id, group_id in keys:
                conn.execute(
                    update(groups)
                    .where(_leased_by(job_id, group_id, owner))
                    .values(lease_expires_at=until)
                )

    def requeue_expired(self, *, max_attempts: int) -> list[tuple[str, str]]:
        """Requeue leased groups whose lease ran out (their dispatcher died)."""
        now = time.time()
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(groups.c.job_id, groups.c.group_id).where(
                    and_(groups.c.state == "leased", groups.c.lease_expires_at < now)
                )
            ).all()
        out = []
        for r in rows:
            self.requeue_group(
                r.job_id, r.group_id, reason="lease expired", max_attempts=max_attempts
            )
            out.append((r.job_id, r.group_id))
        return out

    def requeue_group(self, job_id: str, group_id: str, *, reason: str, max_attempts: int) -> bool:
        """Give a group back to the queue after its worker was lost. Returns True if it was
        requeued; after `max_attempts` its unfinished cases become `error: worker lost`."""
        with self.engine.connect() as conn:
            row = conn.execute(
                select(groups.c.attempts, groups.c.state).where(
                    and_(groups.c.job_id == job_id, groups.c.group_id == group_id)
                )
            ).first()
        if row is None or row.state != "leased":
            return False
        if row.attempts >= max_attempts:
            self.finish_group(
                job_id,
                group_id,
                status="error",
                reason=f"worker lost: {reason} (after {row.attempts} attempts)",
            )
            return False
        with self.engine.begin() as conn:
            conn.execute(
                update(groups)
                .where(
                    and_(
                        groups.c.job_id == job_id,
                        groups.c.group_id == group_id,
                        groups.c.state == "leased",
                    )
                )
                .values(
                    state="pending",
                    worker=None,
                    owner=None,
                    lease_expires_at=None,
                    last_error=reason,
                )
            )
        return True

    def release_group(self, job_id: str, group_id: str, *, owner: str) -> None:
        """Put a group leased by `owner` back in the queue without counting the attempt (its
        API is shutting down)."""
        with self.engine.begin() as conn:
            conn.execute(
                update(groups)
                .where(_leased_by(job_id, group_id, owner))
                .values(
                    state="pending",
                    worker=None,
                    owner=None,
                    lease_expires_at=None,
                    attempts=groups.c.attempts - 1,
                )
            )

    def finish_group(
        self,
        job_id: str,
        group_id: str,
        *,
        status: str = "error",
        reason: str = "the worker returned no result for this case",
    ) -> None:
        """Mark a group done; any of its cases still without a result gets `status` with
        `reason`. Finishes the job when it was its last open group."""
        self._fill_missing(job_id, group_id, status=status, reason=reason)
        with self.engine.begin() as conn:
            conn.execute(
                update(groups)
                .where(
                    and_(
                        groups.c.job_id == job_id,
                        groups.c.group_id == group_id,
                        groups.c.state.in_(("pending", "leased")),
                    )
                )
                .values(state="done", lease_expires_at=None)
            )
            self._maybe_finish_job(conn, job_id)

    def _maybe_finish_job(self, conn: Connection, job_id: str) -> None:
        open_groups = conn.execute(
            select(func.count())
            .select_from(groups)
            .where(and_(groups.c.job_id == job_id, groups.c.state.in_(("pending", "leased"))))
        ).scalar()
        if not open_groups:
            conn.execute(
                update(jobs)
                .where(and_(jobs.c.id == job_id, jobs.c.state.in_(ACTIVE_STATES)))
                .values(state="finished", finished_at=time.time())
            )

    def group_state(self, job_id: str, group_id: str) -> str | None:
        with self.engine.connect() as conn:
            return conn.execute(
                select(groups.c.state).where(
                    and_(groups.c.job_id == job_id, groups.c.group_id == group_id)
                )
            ).scalar()

    # --------------------------------------------------------------- results

    def record_result(self, job_id: str, result: CaseResult) -> int | None:
        """Write one case result unless the case already has one. Returns the result's
        sequence number within the job (the SSE event id), or None for a duplicate."""
        now = time.time()
        col = jobs.c[result.status]
        try:
            with self.engine.begin() as conn:
                # Two statements: take the job's next sequence number (RETURNING), then write
                # the case with it; a case that already has a result rolls both back.
                seq = int(
                    conn.execute(
                        update(jobs)
                        .where(jobs.c.id == job_id)
                        .values({jobs.c.done: jobs.c.done + 1, col: col + 1})
                        .returning(jobs.c.done)
                    ).scalar_one()
                )
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
        except _Duplicate:
            return None
        return seq

    def add_environment(self, job_id: str, env: dict[str, Any]) -> None:
        """Record a worker environment once per job (deduplicated by device and host)."""
        key = (env.get("hostname"), env.get("device"), env.get("device_name"))
        with self.engine.begin() as conn:
            cur = conn.execute(select(jobs.c.environments).where(jobs.c.id == job_id)).scalar()
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

        job = self.require_job(job_id, full=True)
        results = self.case_results(job_id)

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
            summary=Summary.of(results),
            cases=results,
        )

    # ---------------------------------------------------------------- cancel

    def cancel_job(self, job_id: str) -> tuple[JobRecord, list[tuple[str, str]]]:
        """Cancel a job: queued groups will not run; the cases without a result become
        `skipped` ("job cancelled"). Returns the job and the groups that were running (the
        dispatcher tells their workers). Cancelling a finished job changes nothing."""
        job = self.require_job(job_id)
        if job.state not in ACTIVE_STATES:
            return job, []
        with self.engine.begin() as conn:
            running = [
                (r.job_id, r.group_id)
                for r in conn.execute(
                    select(groups.c.job_id, groups.c.group_id).where(
                        and_(groups.c.job_id == job_id, groups.c.state == "leased")
                    )
                )
            ]
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(cancel_requested=True))
            conn.execute(
                update(groups)
                .where(and_(groups.c.job_id == job_id, groups.c.state.in_(("pending", "leased"))))
                .values(state="cancelled", lease_expires_at=None)
            )
        with self.engine.connect() as conn:
            gids = [
                r[0]
                for r in conn.execute(
                    select(groups.c.group_id)
                    .where(groups.c.job_id == job_id)
                    .order_by(groups.c.idx)
                )
            ]
        for gid in gids:
            self._fill_missing(job_id, gid, status="skipped", reason="job cancelled")
        with self.engine.begin() as conn:
            conn.execute(
                update(jobs)
                .where(and_(jobs.c.id == job_id, jobs.c.state.in_(ACTIVE_STATES)))
                .values(state="cancelled", finished_at=time.time())
            )
        return self.require_job(job_id), running

    def _fill_missing(self, job_id: str, group_id: str, *, status: str, reason: str) -> None:
        with self.engine.connect() as conn:
            missing = conn.execute(
                select(cases.c.case_id, cases.c.impl, cases.c.dtype)
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
                CaseResult(
                    case_id=m.case_id,
                    group_id=group_id,
                    suite_index=spec.suite_index,
                    op=spec.op,
                    impl=m.impl,
                    params=spec.params,
                    regime=spec.regime,
                    seed=spec.seed,
                    dtype=m.dtype,
                    status=status,
                    message=reason,
                    coverage=spec.coverage,
                ),
            )  # type: ignore[arg-type]
