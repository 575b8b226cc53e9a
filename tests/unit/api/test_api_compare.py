"""Compare and series routes in-process (the dispatcher idle: results are written to the store as
a worker's would be): by id, by labels, the verdict a spec's compare_to records, the reports
that carry it, a refusal across device kinds, and the series of a case key; the same through the
SDK (its httpx client is the app's test client) and through `kassay compare` / `kassay wait`
(their exit codes and files)."""

from __future__ import annotations

import asyncio
import json
import xml.etree.ElementTree as ET

import httpx
import pytest
from fastapi.testclient import TestClient
from written_jobs import A100, SPEC, finished_job

from kassay import cli
from kassay.api.app import create_app
from kassay.settings import Settings
from kassay_client import AsyncClient, Client
from kassay_client import cli as client_cli
from kassay_client.errors import ConflictError, NotFoundError


@pytest.fixture
def client(tmp_path):
    settings = Settings(database_url=f"sqlite:///{tmp_path}/k.db")
    with TestClient(create_app(settings, dispatch=False)) as c:
        yield c


def test_compare_by_id_and_by_labels(client) -> None:
    main = finished_job(client, {"branch": "main"}, commit="a1")
    # same name, other labels: never chosen
    finished_job(client, {"branch": "other"}, slow=2.0, error=4e-7, peak_bytes=3 << 20)
    # an error within the noise the tolerance policy allows (2x + rounding): no accuracy change
    pr = finished_job(client, {"branch": "pr-7"}, slow=1.2, commit="b2", error=1.5e-7)
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
    assert [p["value"] for p in rel["points"]] == [1e-7, 4e-7, 1.5e-7]
    peak = client.get("/v1/series", params={"key": key, "metric": "peak_bytes"}).json()
    assert [p["value"] for p in peak["points"]] == [1 << 20, 3 << 20, 1 << 20]


def test_nothing_to_compare_and_bad_requests(client) -> None:
    pr = finished_job(client, {"branch": "pr"})
    r = client.get(f"/v1/jobs/{pr}/compare", params={"to_labels": "branch=main"})
    assert r.status_code == 404 and "no finished job named 'ci'" in r.json()["message"]
    r = client.get(f"/v1/jobs/{pr}/compare")
    assert r.status_code == 422 and "compare_to" in r.json()["message"]
    r = client.get(f"/v1/jobs/{pr}/compare", params={"to": pr, "to_labels": "a=b"})
    assert r.status_code == 422
    assert client.get("/v1/series", params={"key": "nope"}).status_code == 422


def test_cross_device_comparison_is_refused(client) -> None:
    a = finished_job(client, {"branch": "main"}, env=A100)
    b = finished_job(client, {"branch": "pr"})
    r = client.get(f"/v1/jobs/{b}/compare", params={"to": a})
    assert r.status_code == 409 and r.json()["error"] == "IncomparableError"
    assert "NVIDIA A100" in r.json()["message"] and "same kind of device" in r.json()["message"]
    # by labels, a job on another kind of device is never chosen
    r = client.get(f"/v1/jobs/{b}/compare", params={"to_labels": "branch=main"})
    assert r.status_code == 404 and "NVIDIA H200" in r.json()["message"]


def test_compare_to_in_the_spec_records_the_verdict_and_reports_carry_it(client) -> None:
    main = finished_job(client, {"branch": "main"})
    spec = {**SPEC, "compare_to": {"labels": {"branch": "main"}, "threshold": 0.05}}
    pr = finished_job(client, {"branch": "pr"}, slow=1.2, spec=spec)
    later_main = finished_job(client, {"branch": "main"}, slow=1.2)  # finished after pr: not chosen
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
    lonely = finished_job(
        client, {"branch": "x"}, spec={**SPEC, "compare_to": {"labels": {"b": "z"}}}
    )
    r = client.get(f"/v1/jobs/{lonely}/compare")
    assert r.status_code == 404 and "nothing to compare" in r.json()["message"]
    assert client.get(f"/v1/jobs/{lonely}/report").json()["comparison"] is None


def test_a_recorded_verdict_stays_with_the_job(client) -> None:
    main = finished_job(client, {"branch": "main"})
    spec = {**SPEC, "compare_to": {"labels": {"branch": "main"}}}
    pr = finished_job(client, {"branch": "pr"}, slow=1.2, spec=spec)
    store = client.app.state.services.store
    assert store.history.recorded_comparison(pr)[0] is False  # nothing asked for it yet
    first = client.get(f"/v1/jobs/{pr}/report").json()["comparison"]
    recorded, comparison, _ = store.history.recorded_comparison(pr)
    assert recorded and comparison is not None and comparison.to_job_id == main
    assert client.get(f"/v1/jobs/{pr}/compare").json() == first


# ----------------------------------------------------------------------- the SDK and the CLI


class _Sdk(Client):
    """The SDK over the app's test client; the CLI's `with` does not close the shared one."""

    def close(self) -> None:
        pass


@pytest.fixture
def sdk(client, monkeypatch):
    kc = _Sdk("http://testserver", token=None, http_client=client)
    monkeypatch.setattr(client_cli, "_client", lambda _args: kc)
    return kc


def test_the_sdk_compares_and_reads_series(client, sdk) -> None:
    main = finished_job(client, {"branch": "main"}, commit="a1")
    pr = finished_job(client, {"branch": "pr"}, slow=1.2, commit="b2")
    by_id = sdk.jobs.compare(pr, to=main)
    by_labels = sdk.jobs.compare(pr, to_labels={"branch": "main"})
    assert by_id.model_dump() == by_labels.model_dump()
    assert by_id.regression and by_id.to_job_id == main and by_id.summary.slower == 1
    (slow,) = [c for c in by_id.cases if c.regression]
    assert slow.impl == "te_style" and slow.speed["verdict"] == "slower"
    assert not sdk.jobs.compare(pr, to=main, threshold=0.25).regression
    assert "1 regression(s)" in sdk.jobs.compare(pr, to=main, format="markdown")
    series = sdk.series(slow.key, labels={"branch": "main"})
    assert [p.job_id for p in series.points] == [main] and series.points[0].labels["commit"] == "a1"
    both = sdk.series(slow.key, metric="device_median_ms")
    assert [p.value for p in both.points] == pytest.approx([1.0, 1.2], rel=0.01)
    with pytest.raises(NotFoundError, match="no finished job named 'ci'"):
        sdk.jobs.compare(pr, to_labels={"branch": "nowhere"})


def test_the_async_sdk_compares_and_reads_series(client) -> None:
    main = finished_job(client, {"branch": "main"})
    pr = finished_job(client, {"branch": "pr"}, slow=1.2)

    async def ask():
        transport = httpx.ASGITransport(app=client.app)
        async with AsyncClient("http://testserver", transport=transport) as kc:
            comparison = await kc.jobs.compare(pr, to_labels={"branch": "main"})
            key = next(c.key for c in comparison.cases if c.regression)
            return comparison, await kc.series(key, metric="device_median_ms")

    comparison, series = asyncio.run(ask())
    assert comparison.to_job_id == main and comparison.regression
    assert [p.job_id for p in series.points] == [main, pr]


def test_the_sdk_refuses_a_comparison_across_device_kinds(client, sdk) -> None:
    a100 = finished_job(client, {"branch": "main"}, env=A100)
    h200 = finished_job(client, {"branch": "pr"})
    with pytest.raises(ConflictError) as refused:
        sdk.jobs.compare(h200, to=a100)
    message = refused.value.message
    assert "NVIDIA A100" in message and "NVIDIA H200" in message
    assert "same kind of device" in message


def test_kassay_compare_writes_files_and_exits_4_on_a_regression(
    client, sdk, tmp_path, capsys
) -> None:
    main = finished_job(client, {"branch": "main"})
    same = finished_job(client, {"branch": "pr"})
    slow = finished_job(client, {"branch": "pr"}, slow=1.2)
    a100 = finished_job(client, {"branch": "x"}, env=A100)
    base = ["compare", "--server", "http://testserver"]
    out_json, out_md = tmp_path / "c.json", tmp_path / "c.md"
    files = ["--json", str(out_json), "--markdown", str(out_md)]
    assert cli.main([*base, slow, main, *files, "--fail-on-regression"]) == 4
    written = json.loads(out_json.read_text())
    assert written["to_job_id"] == main and written["regression"] is True
    markdown = out_md.read_text()
    assert "1 regression(s)" in markdown and "slower" in markdown
    assert capsys.readouterr().out == markdown  # printed too
    # without --fail-on-regression it reports and passes; the same code has no regression
    assert cli.main([*base, slow, main]) == 0
    assert cli.main([*base, same, "--to-labels", "branch=main", "--fail-on-regression"]) == 0
    # a 25% threshold lets the 20% through
    assert cli.main([*base, slow, main, "--threshold", "25%", "--fail-on-regression"]) == 0
    capsys.readouterr()
    # across device kinds: refused, exit 2, the reason on stderr
    assert cli.main([*base, slow, a100]) == 2
    assert "same kind of device" in capsys.readouterr().err


def test_kassay_wait_gate_exit_code_precedence(client, sdk, capsys) -> None:
    """4 only when the regression is the only problem: a failed case outranks it (exit 1); a job
    with nothing to compare with says so and passes."""
    finished_job(client, {"branch": "main"})
    gate = {**SPEC, "compare_to": {"labels": {"branch": "main"}}}
    slow = finished_job(client, {"branch": "pr"}, slow=1.2, spec=gate)
    slow_and_failing = finished_job(
        client, {"branch": "pr"}, slow=1.2, spec=gate, torch_status="failed"
    )
    base = ["wait", "--server", "http://testserver", "--quiet"]
    assert cli.main([*base, slow, "--fail-on-regression"]) == 4
    # not a terminal: the CI log on stdout names the regression and ends in the summary line
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("REGRESSION lse_merge.te_style: slower")
    assert "1 regression(s) against ci" in out[-1] and "exit 4" in out[-1]
    assert cli.main([*base, slow]) == 0
    assert cli.main([*base, slow_and_failing, "--fail-on-regression"]) == 1
    capsys.readouterr()
    first = finished_job(
        client, {"branch": "y"}, spec={**SPEC, "compare_to": {"labels": {"b": "z"}}}
    )
    assert cli.main([*base, first, "--fail-on-regression"]) == 0
    assert "no comparison" in (err := capsys.readouterr().err) and "nothing to compare" in err


def test_a_failure_says_since_when_the_compared_branch_has_it_too(client) -> None:
    """#32: the PR comment and the CI log say where main started to break a case key that the
    PR breaks too; a failure main does not have says nothing of the kind."""
    finished_job(client, {"branch": "main"}, commit="good1")
    finished_job(client, {"branch": "main"}, commit="bad1", torch_status="failed")
    finished_job(client, {"branch": "main"}, commit="bad2", torch_status="failed")
    gate = {**SPEC, "compare_to": {"labels": {"branch": "main"}}}
    pr = finished_job(client, {"branch": "pr"}, spec=gate, torch_status="failed", commit="pr1")
    rep = client.get(f"/v1/jobs/{pr}/report").json()
    torch = next(c for c in rep["cases"] if c["impl"] == "torch")
    assert torch["status"] == "failed" and torch["broken_since"] == "bad1"
    md = client.get(f"/v1/jobs/{pr}/report", params={"format": "markdown"}).text
    assert "(broken since bad1 on the compared branch)" in md
    finished_job(client, {"branch": "main"}, commit="fixed")
    pr2 = finished_job(client, {"branch": "pr"}, spec=gate, torch_status="failed", commit="pr2")
    rep2 = client.get(f"/v1/jobs/{pr2}/report").json()
    assert all(c["broken_since"] == "" for c in rep2["cases"])  # new in this job
