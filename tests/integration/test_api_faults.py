"""Faults: impls that crash, hang and raise; a worker SIGKILLed mid-job; the API SIGKILLed
mid-job and restarted. Each must leave a complete job with every case reported exactly once."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest
from timed_suites import slow_lse_suite

from kassay_client import Client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# Timed cases of ~0.3 s so that a job lasts a few seconds: long enough to kill something.
SLOW = slow_lse_suite(8)


def test_crash_hang_raise_fail_alone(client: Client) -> None:
    spec = {
        "name": "faults",
        "suites": [
            {
                "op": "lse_merge",
                "impls": ["torch", "crash", "hang", "raise", "ring_style"],
                "params": {"T": 8, "Hh": 2, "D": 4, "dtype": "float32", "mode": "step"},
                "regimes": ["normal"],
                "coverage": "none",
                "timing": {"enabled": False},
            }
        ],
    }
    job = client.jobs.create(spec)
    done = client.jobs.wait(job.id, timeout=240)
    assert done.state == "finished"
    status = {c.impl: c.status for c in client.jobs.report(job.id).cases}
    assert status == {
        "torch": "passed",
        "crash": "crashed",
        "hang": "timeout",
        "raise": "error",
        "ring_style": "passed",
    }


def _by_case(report) -> dict[str, object]:
    ids = [c.case_id for c in report.cases]
    assert len(ids) == len(set(ids)), "a case was reported twice"
    return {c.case_id: c for c in report.cases}


def test_worker_killed_midjob_is_replaced(procs) -> None:
    a = procs.worker("worker-a")
    b = procs.worker("worker-b")
    api = procs.api([a, b], stall_s="30")
    try:
        procs.wait_ready(api, a, b, workers_up=2)
        with Client(api.extra["url"], token=procs.write_token) as client:
            job = client.jobs.create({"name": "kill-worker", "suites": [SLOW]})
            victim_groups: list[str] = []
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not victim_groups:
                for w in client.workers.list():
                    if w.address == a.extra["address"] and w.running:
                        victim_groups = [r.split("/", 1)[1] for r in w.running]
                time.sleep(0.05)
            assert victim_groups, "worker A never got a group"
            a.kill()
            done = client.jobs.wait(job.id, timeout=180)
            report = client.jobs.report(job.id)
        assert done.state == "finished" and done.progress.done == done.progress.total == 16
        cases = _by_case(report)
        assert len(cases) == 16
        assert all(c.status == "passed" for c in report.cases), [
            (c.case_id, c.status, c.message) for c in report.cases if c.status != "passed"
        ]
        for gid in victim_groups:  # what A was running was finished by B
            assert any(c.group_id == gid and c.worker == "worker-b" for c in report.cases)
    finally:
        for p in (api, a, b):
            p.stop()


def test_api_killed_midjob_resumes(procs) -> None:
    """With the default lease: the replacement API takes the dead one's groups over within
    seconds, not at a ten-minute lease expiry."""
    w = procs.worker("worker-r")
    db = procs.tmp / "restart.db"
    api = procs.api([w], db=db, name="api-1")
    url = api.extra["url"]
    port = int(url.rsplit(":", 1)[1])
    api2 = None
    try:
        procs.wait_ready(api, w)
        client = Client(url, token=procs.write_token)
        job = client.jobs.create({"name": "kill-api", "suites": [SLOW]})
        deadline = time.monotonic() + 120
        while client.jobs.get(job.id).progress.done < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        before = {c.case_id: c for c in client.jobs.report(job.id).cases}
        assert before
        api.kill()
        api2 = procs.api([w], db=db, port=port, name="api-2")
        procs.wait_ready(api2, w)
        resumed = time.monotonic()
        done_before = client.jobs.get(job.id).progress.done
        while client.jobs.get(job.id).progress.done == done_before:
            assert time.monotonic() - resumed < 30, "the replacement API did not resume the job"
            time.sleep(0.1)
        done = client.jobs.wait(job.id, timeout=180)
        report = client.jobs.report(job.id)
        client.close()
        assert done.state == "finished" and done.progress.done == 16
        cases = _by_case(report)
        assert len(cases) == 16 and all(c.status == "passed" for c in report.cases), [
            (c.case_id, c.status, c.message) for c in report.cases if c.status != "passed"
        ]
        for cid, c in before.items():  # finished cases were not run again
            assert cases[cid].model_dump() == c.model_dump()
        assert httpx.get(f"{url}/readyz").status_code == 200
    finally:
        for p in (api2, api, w):
            if p is not None:
                p.stop()


def _children(pid: int) -> set[int]:
    """Live child processes of `pid`, whichever of its threads started them (Linux /proc)."""
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out |= {int(p) for p in (task / "children").read_text().split()}
        except OSError:
            continue
    return out


def test_serve_restarts_its_worker_and_the_job_finishes(procs) -> None:
    import signal

    port = procs.free_port()
    serve = procs.serve(port=port)
    url = f"http://127.0.0.1:{port}"
    new: set[int] = set()
    try:
        procs.wait_ready(serve, workers_up=1)
        (worker_pid,) = _children(serve.pid)
        with Client(url) as client:
            job = client.jobs.create({"name": "kill-serve-worker", "suites": [SLOW]})
            deadline = time.monotonic() + 120
            while client.jobs.get(job.id).progress.done < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            os.kill(worker_pid, signal.SIGKILL)
            done = client.jobs.wait(job.id, timeout=180)
            report = client.jobs.report(job.id)
        assert done.state == "finished" and done.progress.done == 16
        assert all(c.status == "passed" for c in report.cases), [
            (c.case_id, c.status, c.message) for c in report.cases if c.status != "passed"
        ]
        new = _children(serve.pid)
        assert len(new) == 1 and worker_pid not in new, "the worker was not restarted"
        assert httpx.get(f"{url}/readyz").json()["workers_up"] == 1
    finally:
        serve.stop()
    deadline = time.monotonic() + 15
    while any(os.path.exists(f"/proc/{p}") for p in new) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(os.path.exists(f"/proc/{p}") for p in new), "serve left its worker running"
