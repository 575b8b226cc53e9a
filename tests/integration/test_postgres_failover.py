"""Failover on one PostgreSQL: two API replicas and three CPU workers share one database (each
API dispatches to every worker). SIGKILL an API replica mid-job, then a worker mid-job: each job
completes, every case is reported exactly once and passes, and only the groups in flight on what
was killed run a second time (attempts == 2; every other group ran once), without their cases
that had already finished."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from timed_suites import slow_lse_suite

from kassay_client import Client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

# Timed cases of ~0.3 s: a job of 40 cases over three workers lasts several seconds.
SLOW = slow_lse_suite(20)
CASES = 40


@dataclass
class Cluster:
    url: str  # the database
    apis: list[Any]
    workers: list[Any]
    write_token: str

    def query(self, sql: str, **params: Any) -> list[Any]:
        engine = create_engine(self.url)
        try:
            with engine.connect() as conn:
                return list(conn.execute(text(sql), params))
        finally:
            engine.dispose()

    def attempts(self, job_id: str) -> dict[str, int]:
        rows = self.query("SELECT group_id, attempts FROM groups WHERE job_id = :j", j=job_id)
        return {r.group_id: r.attempts for r in rows}


@pytest.fixture(scope="module")
def cluster(module_procs, postgres_server) -> Iterator[Cluster]:
    url = postgres_server.create_database("failover")
    up = subprocess.run(
        [sys.executable, "-m", "kassay.cli", "db", "upgrade", "--database-url", url],
        env=module_procs.env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert up.returncode == 0, up.stderr
    workers = [module_procs.worker(f"worker-{i}") for i in range(3)]
    # lease 4 s: a dead replica's groups go back to the queue within seconds
    apis = [
        module_procs.api(workers, name=f"api-{n}", database_url=url, lease_s="4", stall_s="60")
        for n in ("a", "b")
    ]
    c = Cluster(url, apis, workers, module_procs.write_token)
    try:
        for api in apis:
            module_procs.wait_ready(api, *workers, workers_up=3)
        yield c
    finally:
        for p in (*apis, *workers):
            p.stop()


def _report_checks(client: Client, job_id: str, before: dict[str, Any]) -> None:
    done = client.jobs.wait(job_id, timeout=240)
    report = client.jobs.report(job_id)
    ids = [c.case_id for c in report.cases]
    assert len(ids) == len(set(ids)) == CASES, "a case was lost or reported twice"
    assert done.state == "finished" and done.progress.done == done.progress.total == CASES
    assert all(c.status == "passed" for c in report.cases), [
        (c.case_id, c.status, c.message) for c in report.cases if c.status != "passed"
    ]
    now = {c.case_id: c for c in report.cases}
    for cid, c in before.items():  # what had finished was not run again
        assert now[cid].model_dump() == c.model_dump()


def test_an_api_replica_killed_midjob(cluster: Cluster) -> None:
    a, b = cluster.apis
    with Client(a.extra["url"], token=cluster.write_token) as on_a:
        job = on_a.jobs.create({"name": "failover-api", "suites": [SLOW]})
        a_group = ""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            running = [r for w in on_a.workers.list() for r in w.running]
            if running and on_a.jobs.get(job.id).progress.done >= 3:
                a_group = running[0].split("/", 1)[1]
                break
            time.sleep(0.05)
        assert a_group, "replica A never ran a group of the job"
        (owner,) = cluster.query(
            "SELECT owner FROM groups WHERE job_id = :j AND group_id = :g", j=job.id, g=a_group
        )
        before = {c.case_id: c for c in on_a.jobs.report(job.id).cases}
    a.kill()
    in_flight = {
        r.group_id
        for r in cluster.query(
            "SELECT group_id FROM groups WHERE job_id = :j AND state = 'leased' AND owner = :o",
            j=job.id,
            o=owner.owner,
        )
    }
    assert in_flight, "replica A held no lease when it was killed"
    with Client(b.extra["url"], token=cluster.write_token) as on_b:
        _report_checks(on_b, job.id, before)
    attempts = cluster.attempts(job.id)
    assert {g for g, n in attempts.items() if n > 1} == in_flight
    assert all(attempts[g] == 2 for g in in_flight), attempts


def test_a_worker_killed_midjob(cluster: Cluster) -> None:
    b = cluster.apis[1]
    victim = cluster.workers[0]
    address = victim.extra["address"]
    with Client(b.extra["url"], token=cluster.write_token) as client:
        job = client.jobs.create({"name": "failover-worker", "suites": [SLOW]})
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            leased = cluster.query(
                "SELECT 1 FROM groups WHERE job_id = :j AND state = 'leased' AND worker = :w",
                j=job.id,
                w=address,
            )
            if leased and client.jobs.get(job.id).progress.done >= 3:
                break
            time.sleep(0.05)
        # Frozen first, so that the set of groups leased to it settles (the APIs stop sending
        # it more once their runs to it are open), then killed.
        assert victim.popen is not None
        victim.popen.send_signal(signal.SIGSTOP)
        time.sleep(1.0)
        in_flight = {
            r.group_id
            for r in cluster.query(
                "SELECT group_id FROM groups WHERE job_id = :j AND state = 'leased' "
                "AND worker = :w",
                j=job.id,
                w=address,
            )
        }
        before = {c.case_id: c for c in client.jobs.report(job.id).cases}
        victim.kill()
        assert in_flight, "the worker held no group when it was killed"
        _report_checks(client, job.id, before)
    attempts = cluster.attempts(job.id)
    assert {g for g, n in attempts.items() if n > 1} == in_flight
    assert all(attempts[g] == 2 for g in in_flight), attempts
