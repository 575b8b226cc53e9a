"""The service end to end: SDK → REST API → gRPC → CPU worker → executor, on loopback."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from kassay_client import (
    AuthenticationError,
    Client,
    PayloadTooLargeError,
    PermissionDeniedError,
    UnprocessableEntityError,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

LSE = {
    "op": "lse_merge",
    "impls": ["torch", "te_style"],
    "params": {"T": 8, "Hh": 2, "D": 4, "dtype": "float32", "K": [2, 3], "mode": "step"},
    "regimes": ["normal", "huge"],
    "coverage": "none",
    "timing": {"enabled": False},
}
FLCE = {
    "op": "flce",
    "impls": ["torch", "kassay"],
    "params": {"N": 8, "H": 16, "V": 32, "dtype": "float32", "reduction": ["mean", "none"]},
    "regimes": ["normal"],
    "coverage": "none",
    "timing": {"enabled": False},
}
SPEC = {"name": "itest", "labels": {"repo": "kassay", "suite": "itest"}, "suites": [LSE, FLCE]}


def _metrics(case) -> dict:
    return {
        o["name"]: (o["max_abs"], o["rel_l2"], o["nan"], o["inf"], o["passed"])
        for o in case.outputs
    }


def test_results_equal_local_run(client: Client) -> None:
    from kassay.contract.spec import parse_spec
    from kassay.validate.local import run_job

    job = client.jobs.create(SPEC)
    assert job.state in ("queued", "running") and job.progress.total == 12
    done = client.jobs.wait(job.id, timeout=180)
    assert done.state == "finished" and done.progress.done == 12
    remote = client.jobs.report(job.id)
    local = run_job(parse_spec(SPEC), device="cpu", ceilings=False)
    assert remote.summary.total == local.summary.total == 12
    by_id = {c.case_id: c for c in local.cases}
    assert [c.case_id for c in remote.cases] == [c.case_id for c in local.cases]
    for case in remote.cases:
        mine = by_id[case.case_id]
        assert case.status == mine.status, (case.case_id, case.message, mine.message)
        expected = {o.name: (o.max_abs, o.rel_l2, o.nan, o.inf, o.passed) for o in mine.outputs}
        assert _metrics(case) == expected, case.case_id
    assert remote.environments and remote.environments[0]["device"] == "cpu"


def test_events_in_order_and_downloads(client: Client) -> None:
    job = client.jobs.create({**SPEC, "suites": [LSE]})
    events = list(client.jobs.events(job.id))
    results = [e for e in events if e.event == "result"]
    assert events[-1].event == "final" and events[-1].job is not None
    assert events[-1].job.state == "finished"
    assert [e.id for e in results] == list(range(1, job.progress.total + 1))
    assert len({e.result.case_id for e in results if e.result}) == job.progress.total
    # resuming after event 2 replays the rest only
    rest = [e.id for e in client.jobs.events(job.id, after=2) if e.event == "result"]
    assert rest == list(range(3, job.progress.total + 1))

    junit = ET.fromstring(client.jobs.report(job.id, format="junit"))
    assert int(junit.get("tests", "0")) == job.progress.total
    md = client.jobs.report(job.id, format="markdown")
    assert "itest" in md and "lse_merge" in md
    rep = client.jobs.report(job.id)
    assert rep.job_id == job.id and rep.schema_version == "kassay.report/v1"
    assert "<html" in client.jobs.report(job.id, format="html").lower()


def test_idempotency_list_and_cancel(client: Client) -> None:
    a = client.jobs.create({**SPEC, "suites": [LSE]}, idempotency_key="ci-1234")
    b = client.jobs.create({**SPEC, "suites": [LSE]}, idempotency_key="ci-1234")
    assert a.id == b.id
    page = client.jobs.list(labels={"suite": "itest"}, limit=100)
    assert a.id in [j.id for j in page.items]
    client.jobs.wait(a.id, timeout=120)
    assert client.jobs.cancel(a.id).state == "finished"  # over: unchanged
    workers = client.workers.list()
    assert workers[0].state == "up" and "lse_merge" in workers[0].ops


def test_auth(stack, read_token: str) -> None:
    with Client(stack.url, token="") as anon:
        with pytest.raises(AuthenticationError):
            anon.jobs.create(SPEC)
        assert anon.jobs.list(limit=1) is not None  # reads are open
    with Client(stack.url, token=read_token) as reader, pytest.raises(PermissionDeniedError):
        reader.jobs.create(SPEC)
    with Client(stack.url, token="wrong") as bad, pytest.raises(AuthenticationError):
        bad.jobs.cancel("job_0")


def test_refusals(client: Client) -> None:
    with pytest.raises(UnprocessableEntityError) as exc:
        client.jobs.create({**SPEC, "suites": [{**LSE, "impls": ["torch", "no_such"]}]})
    assert exc.value.details["loc"] == ["suites", 0, "impls"]
    assert "te_style" in exc.value.details["allowed"]
    with pytest.raises(UnprocessableEntityError) as exc:
        client.jobs.create({**SPEC, "suites": [{**LSE, "params": {"T": 0, "Hh": 2, "D": 4}}]})
    assert exc.value.details["errors"][0]["loc"][:3] == ["suites", 0, "params"]
    with pytest.raises(UnprocessableEntityError) as exc:
        client.jobs.create(
            {**SPEC, "suites": [{**LSE, "params": {"T": 1 << 22, "Hh": 64, "D": 256, "K": 64}}]}
        )
    assert exc.value.code == "ResourceError"
    with pytest.raises(UnprocessableEntityError) as exc:
        # over the case cap (10000)
        grid = {**LSE["params"], "T": [8, 16]}
        client.jobs.create(
            {**SPEC, "suites": [{**LSE, "params": grid, "seeds": list(range(1000))}]}
        )
    assert exc.value.code == "CaseLimitError"
    with pytest.raises(PayloadTooLargeError):
        client.jobs.create("name: big\n" + "#" * 300_000)


def test_cancelling_a_large_running_job_stays_cancelled(client: Client) -> None:
    """A 10,000-case job cancelled while its groups run: cancelled, not finished, whatever
    groups finish meanwhile; so a CI gate waiting on it fails."""
    import time

    big = {
        **LSE,
        "impls": ["torch"],
        "params": {"T": list(range(1, 101)), "Hh": 2, "D": 4, "dtype": "float32"},
        "regimes": ["normal"],
        "seeds": list(range(100)),
    }
    job = client.jobs.create({"name": "cancel-race", "suites": [big]})
    deadline = time.monotonic() + 60
    while client.jobs.get(job.id).progress.done < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    t0 = time.monotonic()
    cancelled = client.jobs.cancel(job.id)
    took = time.monotonic() - t0
    # The store's own test counts the statements a bulk cancel sends (tests/unit/api/test_api_store.py);
    # here the bound only says the call answers well inside a client's timeout: 5 s failed at
    # 5.6-6.1 s on the 2-core box under other builds' load.
    assert cancelled.state == "cancelled" and took < 15.0, took
    time.sleep(1.0)  # groups that were running report in
    done = client.jobs.wait(job.id, timeout=60)
    assert done.state == "cancelled" and done.ok is False
    assert done.progress.done == done.progress.total == 10_000
