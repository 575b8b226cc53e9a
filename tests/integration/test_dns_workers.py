"""Workers found by DNS, with real worker processes on loopback: `dns:///localhost:PORT` through
the system resolver, and a name whose records change (the resolver replaced at the boundary, the
DNS lookup) while jobs run."""

from __future__ import annotations

import time

import httpx
import pytest
from fastapi.testclient import TestClient

from kassay.api.app import create_app
from kassay.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

JOB = {
    "name": "dns",
    "suites": [
        {
            "op": "lse_merge",
            "impls": ["torch"],
            "params": {"T": 8, "Hh": 2, "D": 4, "dtype": "float32", "K": 2},
            "regimes": ["normal"],
            "coverage": "none",
            "timing": {"enabled": False},
        }
    ],
}


def _until(check, timeout: float = 120.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (x.name, tuple(sorted(x.labels.items()))): x.value
        for fam in text_string_to_metric_families(text)
        for x in fam.samples
    }


def test_dns_name_of_a_real_worker(procs) -> None:
    """`dns:///localhost:PORT` finds the worker listening on 127.0.0.1:PORT and runs a job;
    the worker's own /metrics and the API's count what ran."""
    metrics_port = procs.free_port()
    worker = procs.worker(
        "w-dns", env={"KASSAY_WORKER_METRICS_LISTEN": f"127.0.0.1:{metrics_port}"}
    )
    port = int(worker.extra["address"].rsplit(":", 1)[1])
    api = procs.api([f"dns:///localhost:{port}"], worker_resolve_s="0.5")
    try:
        procs.wait_ready(api, worker)
        url = api.extra["url"]
        workers = httpx.get(f"{url}/v1/workers").json()
        assert [(w["address"], w["found_by"], w["state"]) for w in workers] == [
            (f"127.0.0.1:{port}", "localhost", "up")
        ]
        job = httpx.post(f"{url}/v1/jobs", json=JOB).json()

        def done() -> bool:
            return httpx.get(f"{url}/v1/jobs/{job['id']}").json()["state"] == "finished"

        _until(done, what="the job")
        total = httpx.get(f"{url}/v1/jobs/{job['id']}").json()["progress"]["total"]

        worker_side = _samples(httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text)
        ran = {k: v for k, v in worker_side.items() if k[0] == "kassay_worker_cases_total"}
        assert sum(ran.values()) == total and all(dict(k[1])["op"] == "lse_merge" for k in ran), ran
        assert worker_side[("kassay_worker_executor_restarts_total", ())] == 0
        assert not [k for k in worker_side if k[0].startswith("kassay_gpu_")]  # a CPU worker

        api_side = _samples(httpx.get(f"{url}/metrics").text)
        assert api_side[("kassay_jobs", (("state", "finished"),))] == 1
        assert api_side[("kassay_jobs", (("state", "queued"),))] == 0
        assert api_side[("kassay_case_seconds_count", (("op", "lse_merge"),))] == total
        assert api_side[("kassay_admission_seconds_count", (("op", "lse_merge"),))] == 1
        assert api_side[("kassay_workers", ())] == 1
    finally:
        api.stop()
        worker.stop()


class Zone:
    """The records of one name, changed by the test."""

    def __init__(self) -> None:
        self.addresses: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        assert (host, port) == ("kassay-worker", 50051)
        return list(self.addresses)


def test_workers_appear_and_disappear(procs, tmp_path) -> None:
    """No record: the job queues (the API is ready). A record appears: its worker runs the job.
    A second appears and the first goes: the first is retired, the second runs the next job."""
    a, b = procs.worker("w-a"), procs.worker("w-b")
    zone = Zone()
    settings = Settings(
        database_url=f"sqlite:///{tmp_path}/dns.db",
        workers=["dns:///kassay-worker:50051"],
        worker_resolve_s=0.3,
        worker_poll_s=0.3,
    )
    try:
        with TestClient(create_app(settings, resolver=zone)) as c:

            def addresses() -> list[tuple[str, str]]:
                return [(w["address"], w["state"]) for w in c.get("/v1/workers").json()]

            def state(job_id: str) -> str:
                return str(c.get(f"/v1/jobs/{job_id}").json()["state"])

            ready = c.get("/readyz")
            assert ready.status_code == 200 and ready.json()["workers"] == 0
            first = c.post("/v1/jobs", json=JOB).json()["id"]
            time.sleep(1.0)
            assert state(first) == "queued" and addresses() == []

            zone.addresses = [a.extra["address"]]
            _until(lambda: state(first) == "finished", what="the first job on worker a")
            assert addresses() == [(a.extra["address"], "up")]
            cases = c.get(f"/v1/jobs/{first}/report").json()["cases"]
            assert {case["worker"] for case in cases} == {"w-a"}

            zone.addresses = [b.extra["address"]]
            _until(lambda: [x for x, _ in addresses()] == [b.extra["address"]], what="a retired")
            second = c.post("/v1/jobs", json=JOB).json()["id"]
            _until(lambda: state(second) == "finished", what="the second job on worker b")
            cases = c.get(f"/v1/jobs/{second}/report").json()["cases"]
            assert {case["worker"] for case in cases} == {"w-b"}
            assert c.get("/readyz").json()["workers"] == 1
    finally:
        a.stop()
        b.stop()
