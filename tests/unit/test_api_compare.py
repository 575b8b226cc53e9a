"""Compare and series routes in-process (the dispatcher idle: results are written to the store as
a worker's would be): by id, by labels, the verdict a spec's compare_to records, the reports
that carry it, a refusal across device kinds, and the series of a case key."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from fastapi.testclient import TestClient

from kassay.api.app import create_app
from kassay.settings import Settings
from kassay.validate.case_result import case_result
from kassay.validate.results import Environment
from kassay.validate.timing import stats

H200 = Environment(
    device="cuda:0", device_name="NVIDIA H200", torch="2", kassay="0", python="3", hostname="a"
)
A100 = H200.model_copy(update={"device_name": "NVIDIA A100"})
SPEC = {
    "name": "ci",
    "suites": [
        {
            "op": "lse_merge",
            "impls": ["torch", "te_style"],
            "params": {"T": 8, "Hh": 2, "D": 4, "dtype": "float32"},
            "regimes": ["normal"],
            "coverage": "none",
        }
    ],
}


@pytest.fixture
def client(tmp_path):
    settings = Settings(database_url=f"sqlite:///{tmp_path}/k.db")
    with TestClient(create_app(settings, dispatch=False)) as c:
        yield c


def _run(client, labels, *, slow=1.0, env=H200, spec=None, commit="c") -> str:
    """Submit a job and write each case's result (te_style timed `slow` times torch's)."""
    body = {**(spec or SPEC), "labels": {**labels, "commit": commit}}
    job = client.post("/v1/jobs", json=body).json()
    store = client.app.state.services.store
    for job_id, group in store.pending_groups():
        assert job_id == job["id"]
        for impl in group.impls:
            factor = slow if impl == "te_style" else 1.0
            samples = [factor * (1 + 0.001 * (i % 7)) for i in range(50)]
            store.record_result(
                job["id"],
                case_result(
                    group,
                    impl,
                    "passed",
                    timing=stats(samples, "cuda_events", True),
                    environment=env,
                ),
            )
        store.finish_group(job["id"], group.group_id)
    store.add_environment(job["id"], env.model_dump(mode="json"))
    assert client.get(f"/v1/jobs/{job['id']}").json()["state"] == "finished"
    return job["id"]


def test_compare_by_id_and_by_labels(client) -> None:
    main = _run(client, {"branch": "main"}, commit="a1")
    _run(client, {"branch": "other"}, slow=2.0)  # same name, other labels: never chosen
    pr = _run(client, {"branch": "pr-7"}, slow=1.2, commit="b2")
    by_id = client.get(f"/v1/jobs/{pr}/compare", params={"to": main}).json()
    by_labels = client.get(f"/v1/jobs/{pr}/compare", params={"to_labels": "branch=main"}).json()
    assert by_id == by_labels
    assert by_id["to_job_id"] == main and by_id["regression"] is True
    assert by_id["device_kinds"] == ["NVIDIA H200"]
    cases = {c["impl"]: c for c in by_id["cases"]}
    assert cases["te_style"]["speed"]["verdict"] == "slower"
    assert cases["te_style"]["speed"]["ratio"] == pytest.approx(1.2)
    assert cases["torch"]["speed"]["verdict"] == "same" and not cases["torch"]["regression"]
    # a higher threshold (25%) lets the 20% through
    lenient = client.get(f"/v1/jobs/{pr}/compare", params={"to": main, "threshold": 0.25})
    assert lenient.json()["regression"] is False
    md = client.get(f"/v1/jobs/{pr}/compare", params={"to": main, "format": "markdown"}).text
    assert "1 regression(s)" in md and "❌ lse_merge.te_style |" in md and "slower" in md
    # the series of te_style on main, then on any branch
    key = cases["te_style"]["key"]
    on_main = client.get("/v1/series", params={"key": key, "labels": "branch=main"}).json()
    assert [p["job_id"] for p in on_main["points"]] == [main]
    assert on_main["points"][0]["labels"]["commit"] == "a1"
    every = client.get("/v1/series", params={"key": key, "limit": 2}).json()["points"]
    assert [round(p["value"], 3) for p in every] == [2.006, 1.204]  # oldest first, last 2
    rel = client.get("/v1/series", params={"key": key, "metric": "rel_l2"}).json()
    assert [p["value"] for p in rel["points"]] == [None, None, None]  # no outputs written


def test_nothing_to_compare_and_bad_requests(client) -> None:
    pr = _run(client, {"branch": "pr"})
    r = client.get(f"/v1/jobs/{pr}/compare", params={"to_labels": "branch=main"})
    assert r.status_code == 404 and "no finished job named 'ci'" in r.json()["message"]
    r = client.get(f"/v1/jobs/{pr}/compare")
    assert r.status_code == 422 and "compare_to" in r.json()["message"]
    r = client.get(f"/v1/jobs/{pr}/compare", params={"to": pr, "to_labels": "a=b"})
    assert r.status_code == 422
    assert client.get("/v1/series", params={"key": "nope"}).status_code == 422


def test_cross_device_comparison_is_refused(client) -> None:
    a = _run(client, {"branch": "main"}, env=A100)
    b = _run(client, {"branch": "pr"})
    r = client.get(f"/v1/jobs/{b}/compare", params={"to": a})
    assert r.status_code == 409 and r.json()["error"] == "IncomparableError"
    assert "NVIDIA A100" in r.json()["message"] and "same kind of device" in r.json()["message"]
    # by labels, a job on another kind of device is never chosen
    r = client.get(f"/v1/jobs/{b}/compare", params={"to_labels": "branch=main"})
    assert r.status_code == 404 and "NVIDIA H200" in r.json()["message"]


def test_compare_to_in_the_spec_records_the_verdict_and_reports_carry_it(client) -> None:
    main = _run(client, {"branch": "main"})
    spec = {**SPEC, "compare_to": {"labels": {"branch": "main"}, "threshold": 0.05}}
    pr = _run(client, {"branch": "pr"}, slow=1.2, spec=spec)
    later_main = _run(client, {"branch": "main"}, slow=1.2)  # finished after pr: not chosen
    verdict = client.get(f"/v1/jobs/{pr}/compare").json()
    assert verdict["to_job_id"] == main != later_main
    assert verdict["threshold"] == 0.05 and verdict["regression"] is True
    report = client.get(f"/v1/jobs/{pr}/report").json()
    assert report["comparison"] == verdict
    junit = ET.fromstring(client.get(f"/v1/jobs/{pr}/report", params={"format": "junit"}).text)
    failures = [
        (tc.get("classname"), f.get("type"), f.get("message"))
        for tc in junit.iter("testcase")
        for f in tc.iter("failure")
    ]
    assert len(failures) == 1 and failures[0][:2] == ("lse_merge.te_style", "regression")
    assert "x1.200" in failures[0][2] and "+5.0%" in failures[0][2]
    assert junit.get("failures") == "1"
    md = client.get(f"/v1/jobs/{pr}/report", params={"format": "markdown"}).text
    assert "compared with ci" in md and "1 regression(s)" in md
    # a job whose compare_to finds nothing records why
    lonely = _run(client, {"branch": "x"}, spec={**SPEC, "compare_to": {"labels": {"b": "z"}}})
    r = client.get(f"/v1/jobs/{lonely}/compare")
    assert r.status_code == 404 and "nothing to compare" in r.json()["message"]
    assert client.get(f"/v1/jobs/{lonely}/report").json()["comparison"] is None
