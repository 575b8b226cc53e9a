"""The REST routes in-process (no workers, the dispatcher idle): submission and its refusals,
idempotency, auth, listing, reports, SSE, cancel, health, metrics and the dashboard."""

from __future__ import annotations

import json

import pytest
import yaml
from fastapi.testclient import TestClient

from kassay.api.app import create_app
from kassay.api.dispatcher import WorkerLink
from kassay.settings import Settings

SPEC = {
    "name": "routes",
    "labels": {"repo": "kassay"},
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


def _client(tmp_path, **kw) -> TestClient:
    settings = Settings(database_url=f"sqlite:///{tmp_path}/k.db", **kw)
    return TestClient(create_app(settings, dispatch=False))


@pytest.fixture
def client(tmp_path):
    with _client(tmp_path, max_body_bytes=20_000) as c:
        yield c


def test_submit_json_and_yaml_get_list(client):
    r = client.post("/v1/jobs", json=SPEC)
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["state"] == "queued" and job["progress"]["total"] == 4
    assert r.headers["location"] == f"/v1/jobs/{job['id']}"
    r2 = client.post(
        "/v1/jobs", content=yaml.safe_dump(SPEC), headers={"content-type": "application/yaml"}
    )
    assert r2.status_code == 201
    assert client.get(f"/v1/jobs/{job['id']}").json()["id"] == job["id"]
    page = client.get("/v1/jobs", params={"limit": 1}).json()
    assert len(page["items"]) == 1 and page["next_cursor"]
    rest = client.get("/v1/jobs", params={"cursor": page["next_cursor"]}).json()
    assert [j["id"] for j in rest["items"]] == [job["id"]]
    assert len(client.get("/v1/jobs", params=[("label", "repo=kassay")]).json()["items"]) == 2
    assert client.get("/v1/jobs", params={"label": "repo=none"}).json()["items"] == []
    assert client.get("/v1/jobs", params={"name": "routes", "state": "queued"}).json()["items"]


def test_idempotency_key(client):
    h = {"Idempotency-Key": "ci-run-42"}
    a = client.post("/v1/jobs", json=SPEC, headers=h)
    b = client.post("/v1/jobs", json=SPEC, headers=h)
    assert (a.status_code, b.status_code) == (201, 200) and a.json()["id"] == b.json()["id"]
    c = client.post("/v1/jobs", json={**SPEC, "name": "changed"}, headers=h)
    assert c.status_code == 409 and c.json()["error"] == "ConflictError"


@pytest.mark.parametrize(
    ("body", "loc", "needle"),
    [
        (
            {"name": "x", "suites": [{"op": "nope", "impls": ["torch"]}]},
            ["suites", 0, "op"],
            "known ops: flce, lse_merge",
        ),
        (
            {"name": "x", "suites": [{"op": "lse_merge", "impls": ["nope"]}]},
            ["suites", 0, "impls"],
            "known impls:",
        ),
        (
            {
                "name": "x",
                "suites": [
                    {"op": "lse_merge", "impls": ["torch"], "params": {"T": -1, "Hh": 2, "D": 4}}
                ],
            },
            None,
            "T",
        ),
        ({"suites": []}, None, "name"),
    ],
)
def test_invalid_specs_are_422_with_the_field(client, body, loc, needle):
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == 422, r.text
    data = r.json()
    assert needle in data["message"]
    if loc:
        assert data["details"]["loc"] == loc
    else:
        assert data["details"]["errors"][0]["loc"]
    assert client.get("/v1/jobs").json()["items"] == []  # nothing stored


def test_test_impls_hidden_without_workers(client):
    body = {
        "name": "x",
        "suites": [
            {
                "op": "lse_merge",
                "impls": ["crash"],
                "params": {"T": 8, "Hh": 2, "D": 4},
                "regimes": ["normal"],
                "coverage": "none",
            }
        ],
    }
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == 422 and "crash" not in r.json()["details"]["allowed"]


def test_case_cap_and_memory_and_worker_impls(tmp_path):
    with _client(tmp_path, max_cases=3) as c:
        r = c.post("/v1/jobs", json=SPEC)
        assert r.status_code == 422 and r.json()["error"] == "CaseLimitError"
    with _client(tmp_path) as c:
        disp = c.app.state.services.dispatcher
        disp.links = [
            WorkerLink(
                "w:1",
                state="up",
                memory_bytes=10_000,
                ops={"lse_merge": ["torch", "te_style", "crash"]},
            )
        ]
        big = {**SPEC, "suites": [{**SPEC["suites"][0], "params": {"T": 4096, "Hh": 8, "D": 128}}]}
        r = c.post("/v1/jobs", json=big)
        assert r.status_code == 422 and r.json()["error"] == "ResourceError"
        assert "GiB" in r.json()["message"]
        r = c.post(
            "/v1/jobs",
            json={**SPEC, "suites": [{**SPEC["suites"][0], "impls": ["torch", "kassay"]}]},
        )
        assert r.status_code == 422 and r.json()["details"]["allowed"] == [
            "crash",
            "te_style",
            "torch",
        ]
        ok = c.post(
            "/v1/jobs",
            json={**SPEC, "suites": [{**SPEC["suites"][0], "impls": ["torch", "crash"]}]},
        )
        assert ok.status_code == 201, ok.text


def test_body_limit_413(client):
    r = client.post(
        "/v1/jobs",
        content=b"name: x\n" + b"#" * 30_000,
        headers={"content-type": "application/yaml"},
    )
    assert r.status_code == 413 and r.json()["error"] == "PayloadTooLargeError"


def test_auth(tmp_path):
    with _client(tmp_path, api_tokens=["w"], read_tokens=["r"], open_reads=False) as c:
        assert c.post("/v1/jobs", json=SPEC).status_code == 401
        assert (
            c.post("/v1/jobs", json=SPEC, headers={"Authorization": "Bearer x"}).status_code == 401
        )
        assert (
            c.post("/v1/jobs", json=SPEC, headers={"Authorization": "Bearer r"}).status_code == 403
        )
        r = c.post("/v1/jobs", json=SPEC, headers={"Authorization": "Bearer w"})
        assert r.status_code == 201
        jid = r.json()["id"]
        assert c.get(f"/v1/jobs/{jid}").status_code == 401
        assert c.get(f"/v1/jobs/{jid}", headers={"Authorization": "Bearer r"}).status_code == 200
        assert (
            c.post(f"/v1/jobs/{jid}/cancel", headers={"Authorization": "Bearer r"}).status_code
            == 403
        )
        assert c.get("/healthz").status_code == 200
    with _client(tmp_path, api_tokens=["w"]) as c:  # reads open by default
        assert c.get("/v1/jobs").status_code == 200


def test_reports_events_cancel(client):
    jid = client.post("/v1/jobs", json=SPEC).json()["id"]
    job = client.post(f"/v1/jobs/{jid}/cancel").json()
    assert job["state"] == "cancelled" and job["progress"]["skipped"] == 4
    rep = client.get(f"/v1/jobs/{jid}/report").json()
    assert rep["schema_version"] == "kassay.report/v1" and rep["summary"]["skipped"] == 4
    junit = client.get(f"/v1/jobs/{jid}/report", headers={"Accept": "application/xml"})
    assert junit.headers["content-type"].startswith("application/xml")
    assert junit.text.startswith("<?xml")
    md = client.get(f"/v1/jobs/{jid}/report", params={"format": "markdown"})
    assert md.headers["content-type"].startswith("text/markdown") and "routes" in md.text
    html = client.get(f"/v1/jobs/{jid}/report", params={"format": "html"})
    assert "<html" in html.text.lower()
    assert client.get(f"/v1/jobs/{jid}/report", params={"format": "pdf"}).status_code == 422
    events = []
    with client.stream("GET", f"/v1/jobs/{jid}/events") as st:
        for line in st.iter_lines():
            if line.startswith("event:"):
                events.append(line.split(":", 1)[1].strip())
            if line.startswith("data:") and events[-1] == "final":
                assert json.loads(line[5:])["state"] == "cancelled"
    assert events == ["result"] * 4 + ["final"]
    with client.stream("GET", f"/v1/jobs/{jid}/events", headers={"Last-Event-ID": "3"}) as st:
        ids = [line[3:].strip() for line in st.iter_lines() if line.startswith("id:")]
    assert ids == ["4", "4"]
    assert client.get("/v1/jobs/job_nope").status_code == 404
    assert client.get("/v1/jobs/job_nope/events").status_code == 404


def test_health_metrics_dashboard_docs(client):
    client.post("/v1/jobs", json=SPEC)
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200
    m = client.get("/metrics").text
    assert "kassay_jobs_submitted_total 1.0" in m and 'route="/v1/jobs"' in m
    page = client.get("/")
    assert page.status_code == 200 and "routes" in page.text and "report?format=html" in page.text
    assert client.get("/docs").status_code == 200
    assert "/v1/jobs/{job_id}/report" in client.get("/openapi.json").json()["paths"]
    assert client.get("/v1/workers").json() == []


def test_readyz_waits_for_a_worker(tmp_path):
    with _client(tmp_path, workers=["127.0.0.1:1"]) as c:
        r = c.get("/readyz")
        assert r.status_code == 503 and r.json()["workers_up"] == 0
        assert c.get("/v1/workers").json()[0]["state"] == "unknown"
