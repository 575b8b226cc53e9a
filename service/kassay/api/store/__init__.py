"""The job store: jobs, input groups and case results in any SQLAlchemy database.

SQLite (a file, WAL journal) by default; PostgreSQL (psycopg 3, `kassay[postgres]`) by URL, shared
by several API replicas: the group queue's claims lock rows with FOR UPDATE SKIP LOCKED there.
The schema is versioned by Alembic (`migrate`): a Store opens only a database at this kassay's
revision (an empty SQLite file is upgraded on the spot), else SchemaError names
`kassay db upgrade`.
Results persist one by one as workers report them. A case's result is written at most once (the
update only touches a row whose status is still NULL), so a group re-run after a lost worker or
a restarted API never duplicates a case, and never re-runs one: the dispatcher sends only the
impls of a group that have no result yet.

Four parts share one engine: `jobs` (job records), `queue` (the group queue: claims, leases,
requeue, cancel), `results` (case results, environments, reports) and `history` (results by
case key across jobs, comparison targets and verdicts, series). `Store` holds them and offers
their methods under the names callers use; `artifacts` (the code jobs bring) is used as a part.

Every method is synchronous and short; the async dispatcher calls them through a thread.
"""

from __future__ import annotations

from sqlalchemy import select

from kassay.api.store.artifacts import ArtifactRecord, Artifacts
from kassay.api.store.database import make_engine, sqlite_file
from kassay.api.store.history import History
from kassay.api.store.jobs import ACTIVE_STATES, JOB_STATES, JobRecord, Jobs, body_hash, new_job_id
from kassay.api.store.migrate import SchemaError, ensure_current
from kassay.api.store.queue import Claim, GroupQueue
from kassay.api.store.results import Results
from kassay.api.store.sessions import Sessions


class Store:
    """Jobs, groups and cases in one database, in parts with one job each: `jobs` (records,
    lookups), `queue` (groups: claims, leases, requeues, cancellation), `results` (cases,
    reports), `history` (series, comparisons), `artifacts`, `sessions`. Callers name the part
    they use (store.queue.claim_groups): each depends on the narrowest one."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        try:
            ensure_current(self.engine, url)
        except BaseException:
            self.engine.dispose()
            raise
        self.jobs = Jobs(self.engine, sqlite_file(url))
        self.results = Results(self.engine, self.jobs)
        self.queue = GroupQueue(self.engine, self.jobs, self.results)
        self.history = History(self.engine)
        self.artifacts = Artifacts(self.engine)
        self.sessions = Sessions(self.engine)

    def close(self) -> None:
        self.jobs.close()
        self.engine.dispose()

    def ping(self) -> bool:
        with self.engine.connect() as conn:
            conn.execute(select(1)).scalar()
        return True


__all__ = [
    "ACTIVE_STATES",
    "JOB_STATES",
    "ArtifactRecord",
    "Artifacts",
    "Claim",
    "GroupQueue",
    "History",
    "JobRecord",
    "Jobs",
    "Results",
    "SchemaError",
    "Store",
    "body_hash",
    "make_engine",
    "new_job_id",
]
