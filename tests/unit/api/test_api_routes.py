"""The REST routes in-process (no workers, the dispatcher idle): submission and its refusals,
idempotency, auth, listing, reports, SSE, cancel, health, metrics and the dashboard."""

from __future__ import annotations

import json

import pytest
import yaml
from fastapi.testclient import TestClient

from kassay.api.app import create_app
from kassay.api.dispatch import WorkerLink
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


def test_control_characters_in_headers_and_file_names_are_422(client):
    r = client.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": "k\x01"})
    assert r.status_code == 422
    # an empty key is no key: refused, not stored (the second such submission was a 500)
    for _ in range(2):
        assert (
            client.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": ""}).status_code == 422
        )
    assert client.get("/v1/jobs").json()["items"] == []


def test_a_file_name_with_control_characters_is_422(tmp_path):
    with _client(tmp_path, allow_code=True) as c:
        assert _upload(c, name="mine\x00.py").status_code == 422
        assert c.get("/v1/artifacts").json() == []


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
        # control characters in stored text (#31): a NUL is stored by SQLite, refused by
        # PostgreSQL's text columns; a newline forges log lines
        ({**SPEC, "name": "ci\u0000run"}, None, "name"),
        ({**SPEC, "labels": {"branch": "main\nfake"}}, None, "labels"),
        ({**SPEC, "compare_to": {"labels": {"branch": "\u0007"}}}, None, "compare_to"),
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


def test_impl_names_are_taken_on_trust_until_a_worker_is_described(client):
    # The API keeps no impl registry (it imports no torch): with no worker described, any impl
    # name is accepted; the dispatcher fails the group later if no worker offers it.
    body = {
        "name": "x",
        "suites": [
            {
                "op": "lse_merge",
                "impls": ["mine"],
                "params": {"T": 8, "Hh": 2, "D": 4},
                "regimes": ["normal"],
                "coverage": "none",
            }
        ],
    }
    assert client.post("/v1/jobs", json=body).status_code == 201


def test_unrunnable_groups_fail_naming_what_the_workers_offer(tmp_path):
    import asyncio

    with _client(tmp_path) as c:
        body = {**SPEC, "suites": [{**SPEC["suites"][0], "impls": ["torch", "mine"]}]}
        job = c.post("/v1/jobs", json=body).json()
        disp = c.app.state.services.dispatcher
        # w:2 never answered Describe: it may offer `mine`, so the group waits.
        disp.workers.links = [
            WorkerLink("w:1", state="up", ops={"lse_merge": ["torch"]}),
            WorkerLink("w:2"),
        ]
        asyncio.run(disp.sweeper.fail_unrunnable())
        assert c.get(f"/v1/jobs/{job['id']}").json()["state"] == "queued"
        disp.workers.links = [
            WorkerLink("w:1", state="up", ops={"lse_merge": ["torch", "te_style"]})
        ]
        asyncio.run(disp.sweeper.fail_unrunnable())
        done = c.get(f"/v1/jobs/{job['id']}").json()
        assert done["state"] == "finished" and done["ok"] is False
        cases = c.get(f"/v1/jobs/{job['id']}/report").json()["cases"]
        assert {x["status"] for x in cases} == {"error"}
        assert all(
            "no worker offers impl 'mine' for op 'lse_merge'; the workers offer: te_style, torch"
            in x["message"]
            for x in cases
        )


def test_case_cap_and_memory_and_worker_impls(tmp_path):
    with _client(tmp_path, max_cases=3) as c:
        r = c.post("/v1/jobs", json=SPEC)
        assert r.status_code == 422 and r.json()["error"] == "CaseLimitError"
    with _client(tmp_path) as c:
        disp = c.app.state.services.dispatcher
        disp.workers.links = [
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
    # a cancelled run is not ok, in the JSON and in the JUnit a CI step reads (#31)
    assert rep["summary"]["ok"] is False and rep["summary"]["cancelled"] is True
    junit = client.get(f"/v1/jobs/{jid}/report", headers={"Accept": "application/xml"})
    assert junit.headers["content-type"].startswith("application/xml")
    assert junit.text.startswith("<?xml")
    assert 'errors="1"' in junit.text and 'type="cancelled"' in junit.text
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


def test_readyz_is_the_database_not_the_workers(tmp_path):
    # Jobs queue while no worker is up: the API is ready; the body says how many workers are.
    with _client(tmp_path, workers=["127.0.0.1:1"]) as c:
        r = c.get("/readyz")
        assert r.status_code == 200 and r.json()["workers_up"] == 0
        assert c.get("/v1/workers").json()[0]["state"] == "unknown"
        # a job queues meanwhile; the metrics tell the workers' health and the queue apart
        assert c.post("/v1/jobs", json=SPEC).status_code == 201
        from prometheus_client.parser import text_string_to_metric_families

        seen = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(c.get("/metrics").text)
            for s in fam.samples
        }
        assert seen[("kassay_queue_groups", ())] == 2  # K=[2, 3]: two input groups
        assert seen[("kassay_jobs", (("state", "queued"),))] == 1
        assert seen[("kassay_jobs", (("state", "running"),))] == 0
        assert seen[("kassay_workers", ())] == 1 and seen[("kassay_workers_up", ())] == 0

        def down() -> bool:
            raise OSError("the database is gone")

        c.app.state.services.store.ping = down
        r = c.get("/readyz")
        assert r.status_code == 503 and r.json()["database"] == "error: OSError"


def test_admission_compares_with_free_device_memory(tmp_path):
    with _client(tmp_path) as c:
        disp = c.app.state.services.dispatcher
        disp.workers.links = [
            WorkerLink(
                "w:1",
                state="up",
                memory_bytes=10**12,  # a huge card, but another process holds most of it
                memory_free_bytes=10_000,
                ops={"lse_merge": ["torch", "te_style"]},
            )
        ]
        big = {**SPEC, "suites": [{**SPEC["suites"][0], "params": {"T": 4096, "Hh": 8, "D": 128}}]}
        r = c.post("/v1/jobs", json=big)
        assert r.status_code == 422 and r.json()["error"] == "ResourceError"
        assert "free" in r.json()["message"]


MODULE = b"from kassay.impls import Impl\n\ndef impls():\n    return []\n"


def _upload(c: TestClient, data: bytes = MODULE, name: str = "mine.py") -> object:
    return c.post(
        "/v1/artifacts",
        params={"filename": name},
        content=data,
        headers={"content-type": "application/octet-stream"},
    )


def test_code_is_refused_unless_the_server_allows_it(tmp_path):
    """No code tokens: a deployment's default refuses code (403), jobs without artifacts go on;
    KASSAY_ALLOW_CODE=true (what `kassay serve` sets) lets whoever may write bring code."""
    code_spec = {**SPEC, "artifacts": ["a" * 64]}
    with _client(tmp_path / "deployment") as c:
        r = _upload(c)
        assert r.status_code == 403 and "accepts no code" in r.json()["message"]
        r = c.post("/v1/jobs", json=code_spec)
        assert r.status_code == 403 and "KASSAY_CODE_TOKENS" in r.json()["message"]
        assert c.post("/v1/jobs", json=SPEC).status_code == 201
    with _client(tmp_path / "one-machine", allow_code=True) as c:
        first, again = _upload(c), _upload(c)
        assert (first.status_code, again.status_code) == (201, 200), first.text
        digest = first.json()["digest"]
        assert again.json()["digest"] == digest and len(c.get("/v1/artifacts").json()) == 1
        r = c.post("/v1/jobs", json={**SPEC, "artifacts": [digest]})
        assert r.status_code == 201, r.text
        # the store records which job named which artifact
        named = c.app.state.services.store.artifacts.of_job(r.json()["id"])
        assert [a.digest for a in named] == [digest]
        # the device-memory estimate applies to a job that brings code as to any other
        c.app.state.services.dispatcher.workers.links = [
            WorkerLink(
                "w:1",
                state="up",
                memory_bytes=10_000,
                ops={"lse_merge": ["torch"]},
                sandbox={"artifacts": True},
            )
        ]
        params = {"T": 4096, "Hh": 8, "D": 128}
        big = {"artifacts": [digest], "suites": [{**SPEC["suites"][0], "params": params}]}
        r = c.post("/v1/jobs", json={**SPEC, **big})
        assert r.status_code == 422 and r.json()["error"] == "ResourceError", r.text


def test_kassay_serve_allows_code_for_its_user_unless_told_not_to(tmp_path, monkeypatch):
    from kassay.cli import api as cli

    def allow_code() -> bool:
        args = cli.build_serve_parser().parse_args(
            ["--device", "cpu", "--port", "0", "--data-dir", str(tmp_path / "data")]
        )
        emb = cli._embedded(args, "serve")
        assert emb is not None
        return bool(emb.make_server().config.app.state.settings.allow_code)

    monkeypatch.delenv("KASSAY_ALLOW_CODE", raising=False)
    monkeypatch.delenv("KASSAY_CODE_TOKENS", raising=False)
    assert allow_code() is True
    monkeypatch.setenv("KASSAY_ALLOW_CODE", "false")
    assert allow_code() is False
    monkeypatch.delenv("KASSAY_ALLOW_CODE")
    assert Settings().allow_code is False  # `kassay api` (a deployment) does not


def test_a_job_past_its_time_cap_ends_as_timeout(tmp_path):
    import asyncio
    import time

    with _client(tmp_path, max_job_s=3600) as c:
        capped = c.post("/v1/jobs", json={**SPEC, "max_duration_s": 0.2}).json()
        uncapped = c.post("/v1/jobs", json=SPEC).json()
        time.sleep(0.3)
        asyncio.run(c.app.state.services.dispatcher.sweeper.expire_overdue())
        done = c.get(f"/v1/jobs/{capped['id']}").json()
        assert done["state"] == "finished" and done["ok"] is False
        cases = c.get(f"/v1/jobs/{capped['id']}/report").json()["cases"]
        assert {x["status"] for x in cases} == {"timeout"}
        assert "time cap of 0.2 s" in cases[0]["message"]
        assert c.get(f"/v1/jobs/{uncapped['id']}").json()["state"] == "queued"
    with _client(tmp_path, max_job_s=0.1) as c:  # the server's cap bounds every job
        asyncio.run(c.app.state.services.dispatcher.sweeper.expire_overdue())
        assert c.get(f"/v1/jobs/{uncapped['id']}").json()["state"] == "finished"


def test_a_grid_mixing_combinations_the_op_refuses_is_stored_with_those_skipped(client):
    """dtype x autocast: the combinations flce refuses come back skipped with the reason (a
    422 for the whole suite before #29); nothing of them reaches a worker."""
    body = {
        "name": "mix",
        "suites": [
            {
                "op": "flce",
                "impls": ["torch"],
                "params": {
                    "N": 8,
                    "H": 16,
                    "V": 32,
                    "dtype": ["float32", "bfloat16"],
                    "autocast": ["none", "bfloat16"],
                },
                "regimes": ["normal"],
                "coverage": "none",
                "timing": {"enabled": False},
            }
        ],
    }
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["state"] == "queued" and job["progress"]["skipped"] == 1
    rep = client.get(f"/v1/jobs/{job['id']}/report").json()
    (skipped,) = rep["cases"]
    assert skipped["status"] == "skipped" and skipped["dtype"] == "bfloat16"
    assert "autocast='bfloat16' needs dtype='float32'" in skipped["message"]
    # every combination refused: still a 422, nothing stored
    body["suites"][0]["params"]["dtype"] = "bfloat16"
    body["suites"][0]["params"]["autocast"] = ["bfloat16", "float16"]
    assert client.post("/v1/jobs", json=body).status_code == 422
