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
    """Jobs, groups and cases in one database."""

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
        # The parts' methods, bound here so that callers keep one object to talk to.
        self.create_job = self.jobs.create_job
        self.find_by_key = self.jobs.find_by_key
        self.get_job = self.jobs.get_job
        self.require_job = self.jobs.require_job
        self.list_jobs = self.jobs.list_jobs
        self.active_job_ids = self.jobs.active_job_ids
        self.count_by_state = self.jobs.count_by_state
        self.overdue_jobs = self.jobs.overdue_jobs
        self.queue_depth = self.queue.queue_depth
        self.claim_groups = self.queue.claim_groups
        self.claim_group = self.queue.claim_group
        self.pending_groups = self.queue.pending_groups
        self.renew_leases = self.queue.renew_leases
        self.requeue_expired = self.queue.requeue_expired
        self.requeue_group = self.queue.requeue_group
        self.release_group = self.queue.release_group
        self.finish_group = self.queue.finish_group
        self.group_state = self.queue.group_state
        self.cancel_job = self.queue.cancel_job
        self.expire_job = self.queue.expire_job
        self.record_result = self.results.record_result
        self.add_environment = self.results.add_environment
        self.results_since = self.results.results_since
        self.case_results = self.results.case_results
        self.report = self.results.report
        self.latest_matching = self.history.latest_matching
        self.save_comparison = self.history.save_comparison
        self.recorded_comparison = self.history.recorded_comparison
        self.series = self.history.series

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
