"""The API's keepalive pings and the worker's ping policy agree (#31): a group running for many
ping intervals finishes on its first attempt. Before, the worker's server kept gRPC's default
policy and answered the API's pings with GOAWAY too_many_pings, and every in-flight group of the
job was requeued."""

from __future__ import annotations

import time

import pytest

from kassay_client import Client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

#: the API pings every 0.2 s; the `hang` impl holds its group until the 6 s case timeout:
#: ~30 pings with no data on the stream (the API describes its workers only every 60 s here:
#: a Describe's reply is data, which resets the worker's count of pings)
SPEC = {
    "name": "keepalive",
    "suites": [
        {
            "op": "lse_merge",
            "impls": ["torch", "hang"],
            "params": {"T": 8, "Hh": 2, "D": 4, "dtype": "float32"},
            "regimes": ["normal"],
            "coverage": "none",
            "timing": {"enabled": False},
        }
    ],
}


def test_a_group_longer_than_many_ping_intervals_is_not_requeued(procs) -> None:
    w = procs.worker(env={"KASSAY_GRPC_KEEPALIVE_S": "0.2"})
    api = procs.api([w], grpc_keepalive_s="0.2", worker_poll_s="60")
    try:
        procs.wait_ready(api, w)
        with Client(api.extra["url"], token=procs.write_token) as client:
            job = client.jobs.create(SPEC)
            done = client.jobs.wait(job.id, timeout=180)
            status = {c.impl: c.status for c in client.jobs.report(job.id).cases}
        assert done.state == "finished"
        assert status == {"torch": "passed", "hang": "timeout"}
        log = api.tail(400)
        assert "too many pings" not in log.lower() and "requeue" not in log.lower(), log
    finally:
        api.stop()
        w.stop()


def test_a_worker_with_another_policy_is_what_broke_it(procs) -> None:
    """The control: a worker that accepts pings only every 5 s (the default 10 s interval's
    half) against an API pinging every 0.2 s answers too_many_pings, as before the fix."""
    w = procs.worker(env={"KASSAY_GRPC_KEEPALIVE_S": "10"})
    api = procs.api([w], grpc_keepalive_s="0.2", worker_poll_s="60")
    try:
        procs.wait_ready(api, w)
        with Client(api.extra["url"], token=procs.write_token) as client:
            client.jobs.create(SPEC)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if "too many pings" in api.tail(400).lower():
                    break
                time.sleep(0.5)
        assert "too many pings" in api.tail(400).lower(), api.tail(60)
    finally:
        api.stop()
        w.stop()
