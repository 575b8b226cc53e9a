"""The group queue: input groups waiting for a worker, leased to one (claims that expire unless
renewed), requeued when their worker is lost, finished when their cases are in, cancelled with
their job."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    String,
    and_,
    func,
    select,
    true,
    type_coerce,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

from kassay.api.store.jobs import ACTIVE_STATES, JobRecord, Jobs
from kassay.api.store.results import Results
from kassay.api.store.tables import cases, groups, jobs
from kassay.contract.results import Status
from kassay.contract.spec import GroupSpec

#: how many pending groups a claim looks through for one its worker can run
_CANDIDATES = 50
#: a claim that lost its group to a concurrent one (SQLite path)
_LOST_RACE: Any = object()


def _first_runnable(
    rows: Sequence[Any], impls: set[str] | None, code: bool
) -> tuple[Any, GroupSpec] | None:
    """The first of `rows` (candidate groups, queue order) a worker offering `impls` (None:
    any) runs; a group with artifacts takes its impls from them: any code worker runs it."""
    for r in rows:
        raw = r.spec
        spec = GroupSpec.model_validate(json.loads(raw) if isinstance(raw, str) else raw)
        if code if spec.artifacts else impls is None or set(spec.impls) <= impls:
            return r, spec
    return None


@dataclass
class Claim:
    """An input group leased to one worker: the impls still to run and the attempt number."""

    job_id: str
    group: GroupSpec
    attempt: int
    #: the job's groups still pending right after this claim, counted in the claim's own
    #: transaction (a count taken later can see the next run's claims and call this run the
    #: job's last: the dispatcher sends two runs of a job back to back)
    job_pending_after: int = 1


def _leased_by(job_id: str, group_id: str, owner: str) -> ColumnElement[bool]:
    """The group, while `owner` (an API process) holds its lease."""
    return and_(
        groups.c.job_id == job_id,
        groups.c.group_id == group_id,
        groups.c.state == "leased",
        groups.c.owner == owner,
    )


class GroupQueue:
    """The input groups of every job and their leases. Finishing a group fills in its cases
    that have no result (through `results`)."""

    def __init__(self, engine: Engine, jobs: Jobs, results: Results) -> None:
        self.engine = engine
        self.jobs = jobs
        self.results = results
        # Row locks (FOR UPDATE SKIP LOCKED) where the database has them; SQLite has not.
        self._row_locks = engine.dialect.name != "sqlite"

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
        code: bool = False,
        share: int = 1,
    ) -> list[Claim]:
        """Lease up to `n` pending groups to `worker`, all of the oldest queued job's.

        `share` is how many workers are taking from the queue: a claim then takes at most its
        fair part of the job's pending groups (rounded up), so one worker does not batch away
        a job while the others idle."""
        first = self.claim_group(
            worker=worker, owner=owner, lease_s=lease_s, impls=impls, code=code
        )
        if first is None:
            return []
        if share > 1 and n > 1:
            with self.engine.connect() as conn:
                pending = self._pending(conn, first.job_id)
            n = min(n, max(1, -(-(pending + 1) // share)))
        claims = [first]
        while len(claims) < n:
            more = self.claim_group(
                worker=worker,
                owner=owner,
                lease_s=lease_s,
                impls=impls,
                code=code,
                job_id=first.job_id,
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
        code: bool = False,
        job_id: str | None = None,
    ) -> Claim | None:
        """Lease the oldest pending group to `worker`; None when nothing is queued.
        `impls` (what the worker offers, None = anything) skips groups it cannot run; groups
        that name artifacts go only to a worker that runs them (`code`), whatever their impl
        names; `job_id` restricts the claim to one job."""
        for _ in range(20):  # another dispatcher may win the same row: try the next one
            leased = self._lease_one(worker, owner, lease_s, impls, code, job_id)
            if leased is None:
                return None
            row, spec, pending_after = leased
            if row is _LOST_RACE:
                continue
            # A second transaction: the claim holds no group lock while it takes the job's row
            # (stop_job takes the job's row, then its groups: one lock order, no deadlock).
            with self.engine.begin() as conn:
                conn.execute(
                    update(jobs)
                    .where(and_(jobs.c.id == row.job_id, jobs.c.state == "queued"))
                    .values(state="running", started_at=time.time())
                )
                done = {
                    r[0]
                    for r in conn.execute(
                        select(cases.c.impl).where(
                            and_(
                                cases.c.job_id == row.job_id,
                                cases.c.group_id == row.group_id,
                                cases.c.status.is_not(None),
                            )
                        )
                    )
                }
            remaining = [i for i in spec.impls if i not in done]
            if not remaining:  # every case already reported (e.g. before a restart)
                self.finish_group(row.job_id, row.group_id, reason="")
                continue
            return Claim(
                row.job_id,
                spec.model_copy(update={"impls": remaining}),
                row.attempts + 1,
                pending_after,
            )
        return None

    def _lease_one(
        self,
        worker: str,
        owner: str,
        lease_s: float,
        impls: set[str] | None,
        code: bool,
        job_id: str | None,
    ) -> tuple[Any, GroupSpec, int] | None:
        """Lease the oldest pending group `worker` can run: (its row, its spec, how many of its
        job's groups are still pending after it); None when there is none; (_LOST_RACE, spec,
        0) when another claim took it first.

        PostgreSQL: the candidates are read with FOR UPDATE SKIP LOCKED in the leasing
        transaction, so concurrent claims (other threads, other API replicas) each lock
        different rows and never wait on each other. SQLite has one writer at a time and no
        row locks: the candidates are read outside the write and the update checks the group
        is still pending (a lost race updates nothing)."""
        candidates = (
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
            .limit(_CANDIDATES)
        )
        if self._row_locks:
            with self.engine.begin() as conn:
                rows = conn.execute(candidates.with_for_update(skip_locked=True)).all()
                picked = _first_runnable(rows, impls, code)
                if picked is None:
                    return None
                self._set_leased(conn, picked[0], worker, owner, lease_s)
                # uncommitted claims of other transactions still count as pending here: the
                # count errs towards "more to come", never towards "the job's last"
                return picked[0], picked[1], self._pending(conn, picked[0].job_id)
        with self.engine.connect() as conn:
            rows = conn.execute(candidates).all()
        picked = _first_runnable(rows, impls, code)
        if picked is None:
            return None
        with self.engine.begin() as conn:
            if not self._set_leased(conn, picked[0], worker, owner, lease_s):
                return _LOST_RACE, picked[1], 0
            # SQLite: this transaction holds the one write lock, so no other claim lands
            # between the update and the count
            return picked[0], picked[1], self._pending(conn, picked[0].job_id)

    @staticmethod
    def _pending(conn: Connection, job_id: str) -> int:
        return int(
            conn.execute(
                select(func.count())
                .select_from(groups)
                .where(and_(groups.c.job_id == job_id, groups.c.state == "pending"))
            ).scalar_one()
        )

    @staticmethod
    def _set_leased(conn: Connection, r: Any, worker: str, owner: str, lease_s: float) -> bool:
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
                lease_expires_at=time.time() + lease_s,
            )
        )
        return bool(res.rowcount == 1)

    def pending_groups(self, limit: int = 1000) -> list[tuple[str, GroupSpec]]:
        """(job id, spec) of the oldest pending groups, queue order."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(groups.c.job_id, groups.c.spec)
                .where(groups.c.state == "pending")
                .order_by(groups.c.job_seq, groups.c.idx)
                .limit(limit)
            ).all()
        return [(r.job_id, GroupSpec.model_validate(r.spec)) for r in rows]

    def renew_leases(self, keys: Iterable[tuple[str, str]], *, owner: str, lease_s: float) -> None:
        """Extend the leases `owner` holds on these groups. One short transaction per group:
        a transaction holding several group rows could deadlock with a cancel locking the same
        rows in another order."""
        until = time.time() + lease_s
        for job_id, group_id in keys:
            with self.engine.begin() as conn:
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
        self.results.fill_missing(job_id, group_id, status=status, reason=reason)
        with self.engine.begin() as conn:
            # The job's row first: two replicas finishing a job's last two groups at once would
            # each count the other's group as open (neither sees the other's uncommitted update)
            # and neither would finish the job. Locked, they take turns. (SQLite: a no-op, its
            # writers already take turns.)
            conn.execute(select(jobs.c.seq).where(jobs.c.id == job_id).with_for_update())
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

    # ---------------------------------------------------------------- cancel

    def cancel_job(self, job_id: str) -> tuple[JobRecord, list[tuple[str, str]]]:
        """Cancel a job: queued groups will not run; the cases without a result become
        `skipped` ("job cancelled"). Returns the job and the groups that were running (the
        dispatcher tells their workers). Cancelling a job that is over changes nothing."""
        return self.stop_job(job_id, state="cancelled", status="skipped", reason="job cancelled")

    def expire_job(self, job_id: str, *, reason: str) -> tuple[JobRecord, list[tuple[str, str]]]:
        """End a job that ran past its time cap: cases without a result become `timeout` with
        `reason` and the job finishes (not ok). Same contract as cancel_job."""
        return self.stop_job(job_id, state="finished", status="timeout", reason=reason)

    def stop_job(
        self, job_id: str, *, state: str, status: Status, reason: str
    ) -> tuple[JobRecord, list[tuple[str, str]]]:
        """End an active job now in `state`, its unfinished cases given `status` and `reason`.

        One transaction that first moves the job out of the active states (so a group finishing
        meanwhile can no longer finish the job: only queued/running jobs are finished) and then
        settles every group and case in bulk. Results that arrive later for those cases are
        dropped as duplicates. Returns the job and the groups that were leased (running)."""
        self.jobs.require_job(job_id)
        with self.engine.begin() as conn:
            moved = conn.execute(
                update(jobs)
                .where(and_(jobs.c.id == job_id, jobs.c.state.in_(ACTIVE_STATES)))
                .values(
                    state=state,
                    cancel_requested=state == "cancelled",
                    finished_at=time.time(),
                )
            )
            if moved.rowcount != 1:
                running: list[tuple[str, str]] = []
            else:
                running = [
                    (r.job_id, r.group_id)
                    for r in conn.execute(
                        select(groups.c.job_id, groups.c.group_id).where(
                            and_(groups.c.job_id == job_id, groups.c.state == "leased")
                        )
                    )
                ]
                conn.execute(
                    update(groups)
                    .where(
                        and_(groups.c.job_id == job_id, groups.c.state.in_(("pending", "leased")))
                    )
                    .values(state="cancelled", lease_expires_at=None)
                )
                self.results.fill_job_missing(conn, job_id, status=status, reason=reason)
        return self.jobs.require_job(job_id), running
