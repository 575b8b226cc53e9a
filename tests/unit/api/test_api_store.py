"""The job store on a real SQLite file and on a real PostgreSQL server (every test runs on both):
idempotency, claims and leases, results written once, requeue after a lost worker, cancel,
resuming only what is unfinished, and API replicas sharing one database."""

from __future__ import annotations

import dataclasses
import time

import pytest

from kassay.api.store import JOB_STATES, Store, body_hash
from kassay.api.store.migrate import upgrade
from kassay.contract.results import CaseResult
from kassay.contract.spec import parse_spec
from kassay.errors import ConflictError
from kassay.ops.expand import expand

SPEC = {
    "name": "store-test",
    "labels": {"repo": "kassay", "branch": "main"},
    "suites": [
        {
            "op": "lse_merge",
            "impls": ["torch", "te_style"],
            "params": {"T": 8, "Hh": 2, "D": 4, "dtype": "float32", "K": [2, 3]},
            "regimes": ["normal"],
            "coverage": "none",
            "timing": {"enabled": False},
        }
    ],
}


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request, tmp_path) -> str:
    """A new, empty database: a SQLite file, or a database on the session's PostgreSQL
    server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/k.db"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def db_url(empty_url) -> str:
    """The same, with the current schema (`kassay db upgrade`)."""
    upgrade(empty_url)
    return empty_url


@pytest.fixture
def store(db_url):
    s = Store(db_url)
    yield s
    s.close()


def _create(store: Store, key: str | None = None, spec: dict | None = None):
    job_spec = parse_spec(spec or SPEC)
    groups = expand(job_spec)
    return store.jobs.create_job(
        job_spec,
        groups,
        {g.group_id: "float32" for g in groups},
        idempotency_key=key,
        spec_hash=body_hash(job_spec.model_dump_json()),
    )


def _result(claim, impl: str, status: str = "passed") -> CaseResult:
    g = claim.group
    return CaseResult(
        case_id=f"{g.group_id}:{impl}",
        group_id=g.group_id,
        op=g.op,
        impl=impl,
        params=g.params,
        regime=g.regime,
        seed=g.seed,
        dtype="float32",
        status=status,
    )


def test_wal_and_counts(store):
    job, created = _create(store)
    assert created and job.state == "queued" and job.total == 4 and job.done == 0
    if store.engine.dialect.name == "sqlite":
        with store.engine.connect() as conn:
            mode = conn.exec_driver_sql("PRAGMA journal_mode").scalar()
        assert mode == "wal"


def test_idempotency_same_and_conflicting(store):
    a, created_a = _create(store, key="k")
    b, created_b = _create(store, key="k")
    assert created_a and not created_b and a.id == b.id
    with pytest.raises(ConflictError):
        _create(store, key="k", spec={**SPEC, "name": "other"})


def test_claim_record_finish(store):
    job, _ = _create(store)
    claim = store.queue.claim_group(worker="w1", owner="o", lease_s=60)
    assert claim is not None and claim.attempt == 1 and claim.group.impls == ["torch", "te_style"]
    assert store.jobs.get_job(job.id).state == "running"
    assert store.results.record_result(job.id, _result(claim, "torch")) == 1
    assert (
        store.results.record_result(job.id, _result(claim, "torch", "failed")) is None
    )  # once only
    store.queue.finish_group(job.id, claim.group.group_id)  # te_style never reported
    j = store.jobs.get_job(job.id)
    assert j.done == 2 and j.counts["passed"] == 1 and j.counts["error"] == 1
    claim2 = store.queue.claim_group(worker="w1", owner="o", lease_s=60)
    for impl in claim2.group.impls:
        store.results.record_result(job.id, _result(claim2, impl))
    store.queue.finish_group(job.id, claim2.group.group_id)
    j = store.jobs.get_job(job.id)
    assert j.state == "finished" and j.done == 4 and j.ok is False
    assert [seq for seq, _ in store.results.results_since(job.id, 0)] == [1, 2, 3, 4]
    assert [seq for seq, _ in store.results.results_since(job.id, 2)] == [3, 4]
    report = store.results.report(job.id)
    assert report.summary.total == 4 and [c.impl for c in report.cases][:2] == ["torch", "te_style"]


def test_requeue_sends_only_unfinished_impls_and_gives_up(store):
    job, _ = _create(
        store, spec={**SPEC, "suites": [{**SPEC["suites"][0], "params": {"T": 8, "Hh": 2, "D": 4}}]}
    )
    claim = store.queue.claim_group(worker="w1", owner="o", lease_s=60)
    store.results.record_result(job.id, _result(claim, "torch"))
    assert store.queue.requeue_group(job.id, claim.group.group_id, reason="gone", max_attempts=2)
    again = store.queue.claim_group(worker="w2", owner="o", lease_s=60)
    assert again.group.impls == ["te_style"] and again.attempt == 2
    assert not store.queue.requeue_group(
        job.id, again.group.group_id, reason="gone", max_attempts=2
    )
    j = store.jobs.get_job(job.id)
    assert j.state == "finished" and j.counts == {**j.counts, "passed": 1, "error": 1}
    lost = [c for c in store.results.case_results(job.id) if c.status == "error"]
    assert lost[0].message.startswith("worker lost: gone")


def test_expired_lease_is_requeued_and_release(store):
    job, _ = _create(store)
    claim = store.queue.claim_group(worker="w1", owner="dead-api", lease_s=0.01)
    time.sleep(0.05)
    assert store.queue.requeue_expired(max_attempts=3) == [(job.id, claim.group.group_id)]
    c2 = store.queue.claim_group(worker="w1", owner="new", lease_s=60)
    store.queue.release_group(job.id, c2.group.group_id, owner="new")
    c3 = store.queue.claim_group(worker="w1", owner="new", lease_s=60)
    assert c3.group.group_id == c2.group.group_id and c3.attempt == c2.attempt


def test_cancel_skips_the_rest(store):
    job, _ = _create(store)
    claim = store.queue.claim_group(worker="w1", owner="o", lease_s=60)
    store.results.record_result(job.id, _result(claim, "torch"))
    cancelled, running = store.queue.cancel_job(job.id)
    assert running == [(job.id, claim.group.group_id)]
    assert cancelled.state == "cancelled" and cancelled.done == 4
    assert cancelled.counts["skipped"] == 3
    assert store.queue.claim_group(worker="w1", owner="o", lease_s=60) is None
    assert store.results.record_result(job.id, _result(claim, "te_style")) is None


def test_jobs_counted_by_state_and_queue_depth(store):
    assert store.jobs.count_by_state() == {} and store.queue.queue_depth() == 0
    a, _ = _create(store)
    b, _ = _create(store)
    groups = store.queue.queue_depth()
    assert store.jobs.count_by_state() == {"queued": 2} and groups > 0
    store.queue.cancel_job(a.id)
    assert store.jobs.count_by_state() == {"queued": 1, "cancelled": 1}
    assert store.queue.queue_depth() == groups // 2 and b.state == "queued"


def test_list_filters_and_pages(store):
    ids = [_create(store)[0].id for _ in range(3)]
    _create(store, spec={**SPEC, "name": "other", "labels": {"repo": "x"}})
    assert [j.id for j in store.jobs.list_jobs(name="store-test")] == ids[::-1]
    assert len(store.jobs.list_jobs(labels={"repo": "kassay", "branch": "main"})) == 3
    assert store.jobs.list_jobs(labels={"repo": "nope"}) == []
    page = store.jobs.list_jobs(limit=2)
    rest = store.jobs.list_jobs(limit=10, before=page[-1].seq)
    assert len(page) == 2 and len(rest) == 2
    assert store.jobs.list_jobs(state="finished") == []


def test_claim_groups_batches_one_jobs_groups(store):
    a, _ = _create(store)  # two groups (K = 2, 3)
    b, _ = _create(store, spec={**SPEC, "name": "other"})
    first = store.queue.claim_groups(4, worker="w1", owner="o", lease_s=60)
    assert [c.job_id for c in first] == [a.id, a.id]  # never mixes jobs in one batch
    assert len({c.group.group_id for c in first}) == 2
    second = store.queue.claim_groups(4, worker="w1", owner="o", lease_s=60)
    assert [c.job_id for c in second] == [b.id, b.id]
    assert store.queue.claim_groups(4, worker="w1", owner="o", lease_s=60) == []


def test_claim_groups_leaves_a_fair_share_to_other_workers(store):
    spec = {**SPEC, "suites": [{**SPEC["suites"][0], "seeds": list(range(4))}]}  # 8 groups
    job, _ = _create(store, spec=spec)
    a = store.queue.claim_groups(8, worker="w1", owner="o", lease_s=60, share=2)
    assert len(a) == 4  # half of 8 pending
    b = store.queue.claim_groups(8, worker="w1", owner="o", lease_s=60, share=2)
    assert len(b) == 2  # half of the 4 left
    c = store.queue.claim_groups(8, worker="w2", owner="o", lease_s=60, share=2)
    assert len(c) == 1  # half of 2
    d = store.queue.claim_groups(8, worker="w2", owner="o", lease_s=60, share=2)
    assert len(d) == 1  # the last one (never 0 while something is pending)
    # what each claim saw still pending, counted with it: only the last batch is the job's last
    assert [x[-1].job_pending_after for x in (a, b, c, d)] == [4, 2, 1, 0]
    assert {x.group.group_id for x in a + b + c + d} == {
        g.group_id for g in expand(parse_spec(spec))
    }
    assert store.queue.claim_groups(8, worker="w2", owner="o", lease_s=60, share=2) == []
    assert all(x.job_id == job.id for x in a + b + c + d)


def test_a_result_is_recorded_once_with_consecutive_sequence_numbers(store):
    _create(store)
    claim = store.queue.claim_group(worker="w1", owner="o", lease_s=60)
    seqs = [
        store.results.record_result(claim.job_id, _result(claim, impl))
        for impl in claim.group.impls
    ]
    assert seqs == [1, 2]
    assert store.results.record_result(claim.job_id, _result(claim, "torch", "failed")) is None
    job = store.jobs.require_job(claim.job_id)
    assert job.done == 2 and job.counts["passed"] == 2 and job.counts["failed"] == 0


def test_a_cancelled_job_stays_cancelled_while_groups_finish(store):
    """Cancelling a 10,000-case job while a worker keeps finishing groups: the job ends
    cancelled (never finished with ok=true), every case is accounted for once, and the cancel
    itself is a bulk operation, not one transaction per group."""
    import threading

    big = {
        **SPEC,
        "suites": [
            {
                **SPEC["suites"][0],
                "params": {"T": list(range(1, 51)), "Hh": 2, "D": 4, "dtype": "float32"},
                "seeds": list(range(100)),
            }
        ],
    }
    job, _ = _create(store, spec=big)
    assert job.total == 10_000
    stop = threading.Event()

    def worker() -> None:
        while not stop.is_set():
            claim = store.queue.claim_group(worker="w", owner="o", lease_s=60)
            if claim is None:
                return
            for impl in claim.group.impls:
                store.results.record_result(job.id, _result(claim, impl))
            store.queue.finish_group(job.id, claim.group.group_id)

    # The statements the cancelling thread sends (the worker thread's are not counted): a
    # handful whatever the number of cases and groups, not one or more per group (5,000 here).
    # Counted, not timed: a time bound failed under a loaded CI host.
    from sqlalchemy import event

    me = threading.get_ident()
    statements: list[str] = []

    def count(_conn, _cursor, statement, *_args) -> None:
        if threading.get_ident() == me:
            statements.append(statement)

    t = threading.Thread(target=worker)
    t.start()
    time.sleep(0.3)  # some groups finish first
    event.listen(store.engine, "before_cursor_execute", count)
    t0 = time.monotonic()
    store.queue.cancel_job(job.id)
    took = time.monotonic() - t0
    event.remove(store.engine, "before_cursor_execute", count)
    stop.set()
    t.join(timeout=30)
    final = store.jobs.require_job(job.id)
    assert final.state == "cancelled" and final.ok is False
    assert final.done == final.total == 10_000
    assert final.counts["passed"] + final.counts["skipped"] == 10_000
    assert final.counts["skipped"] > 0
    assert len(store.results.case_results(job.id)) == 10_000
    assert len(statements) <= 20, (len(statements), f"{took:.1f} s")


def test_the_status_read_answers_what_the_full_read_does_in_every_state(store):
    """get_job, the hot status read (a plain sqlite3 connection on SQLite, a prepared psycopg
    statement on PostgreSQL), returns the record the SQLAlchemy reads return: for a finished, a
    running, a cancelled and a queued job with labels, counts and timestamps; None for a job
    that does not exist."""
    done, _ = _create(store, spec={**SPEC, "labels": {"repo": "kassay", "pr": "7"}})
    for status in ("passed", "failed"):
        claim = store.queue.claim_group(worker="w1", owner="o", lease_s=60)
        for impl in claim.group.impls:
            store.results.record_result(done.id, _result(claim, impl, status))
        store.queue.finish_group(done.id, claim.group.group_id)
    running, _ = _create(store)
    claim = store.queue.claim_group(worker="w1", owner="o", lease_s=60)
    store.results.record_result(running.id, _result(claim, "torch"))
    cancelled, _ = _create(store, spec={**SPEC, "labels": {}})
    store.queue.cancel_job(cancelled.id)
    _create(store)  # stays queued
    listed = {j.id: j for j in store.jobs.list_jobs()}  # SQLAlchemy, the summary columns
    assert {j.state for j in listed.values()} == set(JOB_STATES)
    from sqlalchemy import event

    through_engine: list[str] = []

    def count(*args) -> None:
        through_engine.append(args[2])

    for job_id, want in listed.items():
        event.listen(store.engine, "before_cursor_execute", count)
        got = store.jobs.get_job(job_id)
        event.remove(store.engine, "before_cursor_execute", count)
        assert got == want
        assert through_engine == []  # the fast read, not SQLAlchemy's
        full = store.jobs.get_job(job_id, full=True)
        assert dataclasses.replace(full, spec={}, environments=[]) == got
    got = store.jobs.get_job(done.id)
    assert got.labels == {"repo": "kassay", "pr": "7"} and got.finished_at >= got.started_at
    assert got.counts["passed"] == got.counts["failed"] == 2 and got.ok is False
    assert store.jobs.get_job(cancelled.id).cancel_requested is True
    assert store.jobs.get_job("job_0000000000000000") is None


def _other_backends(admin, database: str) -> list[int]:
    rows = admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
        (database,),
    ).fetchall()
    return [r[0] for r in rows]


def test_postgres_reads_survive_dropped_connections_and_close_releases_them(pg_url):
    """The server drops every connection of a replica's store (a restarted database, an idle
    timeout, pg_terminate_backend): the next status read (no pre-ping on its connections)
    retries once on a new connection and succeeds, and so does the next SQLAlchemy read (the
    engine's pre-ping). Closing the store leaves no connection behind."""
    import psycopg
    from sqlalchemy import make_url

    upgrade(pg_url)
    url = make_url(pg_url)
    store = Store(pg_url)
    job, _ = _create(store)
    assert store.jobs.get_job(job.id) == job
    with psycopg.connect(
        url.set(drivername="postgresql").render_as_string(hide_password=False), autocommit=True
    ) as admin:
        pids = _other_backends(admin, url.database)
        assert pids
        for pid in pids:  # waits (up to 5 s) until the backend is gone
            admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
        assert store.jobs.get_job(job.id) == job
        assert store.jobs.get_job(job.id) == job
        assert store.jobs.list_jobs() == [job]
        store.close()
        deadline = time.monotonic() + 10
        while _other_backends(admin, url.database) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _other_backends(admin, url.database) == []


def test_replicas_starting_together_create_the_schema_once(empty_url):
    """Several API processes (or their `kassay db upgrade` init steps) opening one new database
    at the same moment: each comes up, none raises. SQLite: each Store upgrades the empty file
    itself; PostgreSQL: each runs `kassay db upgrade` (an advisory lock orders them), then
    opens its Store."""
    import threading

    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def open_store() -> None:
        try:
            start.wait()
            if not empty_url.startswith("sqlite"):
                upgrade(empty_url)
            Store(empty_url).close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors


def test_replicas_claiming_at_once_never_share_a_group(db_url):
    """Four API replicas (a Store each: their own engine and connections) claiming from one
    queue at the same moment: every group is leased exactly once, none is left behind."""
    import threading

    spec = {**SPEC, "suites": [{**SPEC["suites"][0], "seeds": list(range(30))}]}  # 60 groups
    first = Store(db_url)
    job, _ = _create(first, spec=spec)
    replicas = [Store(db_url) for _ in range(4)]
    claimed: list[list[str]] = [[] for _ in replicas]
    start = threading.Barrier(len(replicas))

    lasts: list[str] = []

    def claim_all(i: int) -> None:
        start.wait()
        while (
            c := replicas[i].queue.claim_group(worker=f"w{i}", owner=f"api{i}", lease_s=60)
        ) is not None:
            claimed[i].append(c.group.group_id)
            if c.job_pending_after == 0:
                lasts.append(c.group.group_id)

    threads = [threading.Thread(target=claim_all, args=(i,)) for i in range(len(replicas))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    everything = [g for got in claimed for g in got]
    assert sorted(everything) == sorted(g.group_id for g in expand(parse_spec(spec)))
    assert len(set(everything)) == len(everything) == 60
    assert sum(1 for got in claimed if got) >= 2, "one replica took every group"
    # racing claims may err towards "more to come", never call two claims the job's last (a
    # code job's impl runner ends with the run that holds its last claim: #42)
    assert len(lasts) <= 1, lasts
    for s in (first, *replicas):
        s.close()
    assert job.total == 120


def test_replicas_finishing_a_jobs_last_groups_at_once_finish_the_job(db_url):
    """Two replicas finish the last two groups of a job at the same moment, twenty times over:
    every job ends finished (neither may miss the other's group and leave the job running)."""
    import threading

    a, b = Store(db_url), Store(db_url)
    jobs = [_create(a)[0] for _ in range(20)]
    for job in jobs:
        c1 = a.queue.claim_group(worker="w1", owner="api-a", lease_s=60)
        c2 = b.queue.claim_group(worker="w2", owner="api-b", lease_s=60)
        assert c1 and c2 and c1.job_id == c2.job_id == job.id
        for store, claim in ((a, c1), (b, c2)):
            for impl in claim.group.impls:
                store.results.record_result(job.id, _result(claim, impl))
        start = threading.Barrier(2)

        def finish(store: Store, claim, start: threading.Barrier = start) -> None:
            start.wait()
            store.queue.finish_group(claim.job_id, claim.group.group_id)

        threads = [
            threading.Thread(target=finish, args=(a, c1)),
            threading.Thread(target=finish, args=(b, c2)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    states = [a.jobs.require_job(j.id).state for j in jobs]
    a.close()
    b.close()
    assert states == ["finished"] * len(jobs)
