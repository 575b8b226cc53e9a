"""Job records: a job's row (state, labels, progress counters), its creation with its groups and
cases, and the reads of jobs by id, idempotency key or filters."""

from __future__ import annotations

import hashlib
import json
import secrets
import sqlite3
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, Engine, and_, bindparam, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from kassay.api.store.tables import STATUS_COLUMNS, cases, groups, job_labels, jobs
from kassay.contract.spec import GroupSpec, JobSpec
from kassay.errors import ConflictError, NotFoundError

if TYPE_CHECKING:
    from kassay.api.store.prepared import PreparedRead

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


def label_filters(labels: Mapping[str, str]) -> list[ColumnElement[bool]]:
    """WHERE conditions on `jobs`: the job carries every one of `labels`."""
    return [
        select(job_labels.c.job_id)
        .where(
            and_(
                job_labels.c.job_id == jobs.c.id,
                job_labels.c.key == k,
                job_labels.c.value == v,
            )
        )
        .exists()
        for k, v in labels.items()
    ]


def new_job_id() -> str:
    return "job_" + secrets.token_hex(8)


def body_hash(data: bytes | str) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return hashlib.sha256(raw).hexdigest()


#: the columns of a job's state and progress (not its spec and environments: big JSON)
_SUMMARY = [
    c for c in jobs.c if c.name not in ("spec", "environments", "body_hash", "idempotency_key")
]


# Built once: constructing a 20-column select costs more than running it on SQLite.
_GET_JOB = select(*_SUMMARY).where(jobs.c.id == bindparam("job_id"))
_GET_JOB_FULL = select(jobs).where(jobs.c.id == bindparam("job_id"))


_FAST_SQL = f"SELECT {', '.join(c.name for c in _SUMMARY)} FROM jobs WHERE id = ?"
_PG_FAST_SQL = _FAST_SQL.replace("?", "%s")


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


class Jobs:
    """The job records of one database."""

    def __init__(self, engine: Engine, sqlite_path: str | None) -> None:
        self.engine = engine
        # SQLite file: the hot read (a job's state by id) uses a plain sqlite3 connection per
        # thread, ~10x cheaper than going through SQLAlchemy's pool and compiler.
        self._sqlite_path = sqlite_path
        self._local = threading.local()
        # PostgreSQL through psycopg 3: the same read as a prepared statement on connections
        # of its own (imported here: psycopg is the optional `postgres` extra).
        self._pg_read: PreparedRead | None = None
        if engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg":
            from kassay.api.store.prepared import PreparedRead

            self._pg_read = PreparedRead(engine, _PG_FAST_SQL)

    def close(self) -> None:
        """Close the connections of the fast reads (the engine is the Store's to dispose)."""
        if self._pg_read is not None:
            self._pg_read.close()

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
                                # a grid point the op refuses never runs (its cases are
                                # reported skipped below)
                                "state": "done" if g.skip else "pending",
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
        if not full and self._pg_read is not None:
            m = self._pg_read.fetchone((job_id,))
            return _record(_Mapped(m)) if m is not None else None
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
        for cond in label_filters(labels or {}):
            q = q.where(cond)
        with self.engine.connect() as conn:
            return [_record(r) for r in conn.execute(q)]

    def count_by_state(self) -> dict[str, int]:
        """How many jobs are in each state (states with none are absent)."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(jobs.c.state, func.count()).group_by(jobs.c.state)).all()
        return {str(state): int(n) for state, n in rows}

    def active_job_ids(self) -> list[str]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(jobs.c.id).where(jobs.c.state.in_(ACTIVE_STATES)))
            return [r[0] for r in rows]

    def overdue_jobs(self, *, now: float, max_job_s: float) -> list[tuple[str, float]]:
        """Active jobs older than their time cap: (id, cap in seconds). A job's cap is its
        spec's `max_duration_s`, never more than `max_job_s`, counted from submission."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(jobs.c.id, jobs.c.created_at, jobs.c.spec).where(
                    jobs.c.state.in_(ACTIVE_STATES)
                )
            ).all()
        out = []
        for r in rows:
            asked = (r.spec or {}).get("max_duration_s")
            cap = min(float(asked), max_job_s) if asked else max_job_s
            if now - r.created_at > cap:
                out.append((r.id, cap))
        return out
