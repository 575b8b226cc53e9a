"""The dashboard's server side in-process: the limit a failed output broke, the params a case
table shows, what a case row expands to, the jobs page's filters and paging, the history page's
regressions, browser sign-in (a cookie that grants reads only), the offline docs and HTML
report, and the typed OpenAPI schema with its examples."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from written_jobs import H200, SPEC, finished_job

from kassay.api.app import create_app
from kassay.api.auth import SESSION_COOKIE, LoginThrottle, session_cookie, valid_session
from kassay.api.openapi_extras import JOB_SPEC_EXAMPLE, report_example
from kassay.contract.results import (
    CaseResult,
    MemoryStats,
    OutputMetrics,
    Report,
    Summary,
    WorstEntry,
)
from kassay.contract.spec import JobSpec
from kassay.reports.cases import failed_limits, worst_output
from kassay.reports.html import case_detail, to_html, varying
from kassay.settings import Settings
from kassay.validate.timing import stats

READ, WRITE = "read-token-1", "write-token-1"


def _output(**kw: object) -> OutputMetrics:
    base: dict[str, object] = {
        "name": "grad_input",
        "dtype": "float32",
        "expected_dtype": "float32",
        "shape": [4, 4],
        "max_abs": 1e-6,
        "max_rel": 1e-6,
        "rel_l2": 1e-7,
        "max_ulp": 1,
        "nan": 0,
        "inf": 0,
        "ref_nan": 0,
        "ref_inf": 0,
        "threshold_max_abs": 1e-5,
        "threshold_rel_l2": 1e-6,
    }
    return OutputMetrics.model_validate({**base, **kw})


def _case(i: int, params: dict[str, object], outputs: list[OutputMetrics]) -> CaseResult:
    status = "passed" if all(o.passed for o in outputs) else "failed"
    return CaseResult(
        case_id=f"c{i}",
        group_id=f"g{i}",
        op="flce",
        impl="torch",
        params=params,
        regime="normal",
        seed=0,
        dtype="float32",
        status=status,
        outputs=outputs,
    )


def test_a_failed_row_names_the_limit_that_failed() -> None:
    only_abs = _output(max_abs=3e-4, passed=False, reason="max_abs 0.0003 > 1e-05")
    assert failed_limits(only_abs) == ["max_abs 0.0003 > limit 1e-05"]
    only_rel = _output(rel_l2=5e-6, passed=False)
    assert failed_limits(only_rel) == ["rel_l2 5e-06 > limit 1e-06"]
    both = _output(max_abs=3e-4, rel_l2=float("nan"), passed=False)
    assert [x.split()[0] for x in failed_limits(both)] == ["max_abs", "rel_l2"]
    # no metric limit broken (NaN where the reference is finite, absolute policy): the reason
    nonfinite = _output(passed=False, reason="2 NaN/Inf element(s) where the reference is finite")
    assert failed_limits(nonfinite) == [nonfinite.reason]
    assert failed_limits(_output()) == []
    # the report's one-line summary shows the limit that failed, not the rel-L2 limit
    line = worst_output(_case(0, {"N": 4}, [only_abs]))
    assert "failed: max_abs" in line and "limit 1e-06" not in line


def test_the_case_table_shows_only_the_params_that_vary() -> None:
    cases = [
        _case(0, {"N": 16, "H": 32, "V": 64, "bias": False}, [_output()]),
        _case(1, {"N": 16, "H": 32, "V": 96, "bias": False}, [_output()]),
        _case(2, {"N": 16, "H": 32, "V": 96, "bias": True}, [_output()]),
    ]
    vary, fixed = varying(cases)
    assert vary == ["V", "bias"]
    assert fixed == {"N": 16, "H": 32, "dtype": "float32", "regime": "normal", "seed": 0}


def test_a_case_row_expands_to_errors_worst_elements_timing_and_memory() -> None:
    worst = [WorstEntry(index=[2, 3], value=1.5, reference=1.25, abs_err=0.25)]
    bad = _output(max_abs=0.25, passed=False, worst=worst)
    case = _case(0, {"N": 4}, [bad])
    timing = stats([1.0, 1.25, 1.5, 2.0], "cuda_events", True)
    case.timing = timing.model_copy(update={"wall_median_ms": 1.75})
    case.memory = MemoryStats(measured=True, peak_extra_bytes=3 << 20, model_bytes=2 << 20)
    text = html.unescape(re.sub(r"<[^>]+>", "", case_detail(case)))
    assert "failed limit max_abs 0.25 > limit 1e-05" in text  # the limit that failed
    assert "1e-07 / 1e-06" in text  # each output's errors against its limits
    assert "grad_input[2, 3]: got 1.5, want 1.25 (|err| 0.25)" in text  # worst elements
    assert "device time (events, cuda_events): median 1.375 ms" in text
    assert "wall 1.75 ms" in text and "samples (ms): 1, 1.25, 1.5, 2" in text
    assert "peak extra 3.00 MiB against 2.00 MiB unavoidable" in text


def _client(tmp_path: Path, **kw: object) -> TestClient:
    settings = Settings(database_url=f"sqlite:///{tmp_path}/k.db", **kw)  # type: ignore[arg-type]
    return TestClient(create_app(settings, dispatch=False))


def _job_ids(page: str) -> list[str]:
    return re.findall(r"<tr data-job-id='(job_[0-9a-f]+)'", page)


def test_the_jobs_page_filters_by_state_name_and_label_and_pages(tmp_path: Path) -> None:
    with _client(tmp_path) as c:
        main = finished_job(c, {"branch": "main"})
        pr = finished_job(c, {"branch": "pr"})
        queued = c.post("/v1/jobs", json={**SPEC, "name": "other"}).json()["id"]
        assert _job_ids(c.get("/").text) == [queued, pr, main]  # newest first
        assert _job_ids(c.get("/", params={"state": "queued"}).text) == [queued]
        assert _job_ids(c.get("/", params={"state": "finished"}).text) == [pr, main]
        assert _job_ids(c.get("/", params={"name": "other"}).text) == [queued]
        assert _job_ids(c.get("/", params={"label": "branch=pr"}).text) == [pr]
        both = c.get("/", params={"state": "finished", "label": "branch=main"}).text
        assert _job_ids(both) == [main]
        # one job a page: "older" links walk every job once, keeping the filters
        seen, url = [], "/?limit=1&state=finished"
        while url:
            text = c.get(url).text
            seen += _job_ids(text)
            older = re.search(r"<a href='(/\?[^']+)' rel='next'>", text)
            url = older.group(1).replace("&amp;", "&") if older else ""
            assert not older or "state=finished" in url
        assert seen == [pr, main]


def test_the_job_page_has_environment_failures_first_and_every_report(tmp_path: Path) -> None:
    env = H200.model_copy(update={"driver": "570.1", "clocks": {"sm_max": "1980 MHz"}})
    with _client(tmp_path) as c:
        job = finished_job(c, {"branch": "main"}, env=env, torch_status="failed")
        page = c.get(f"/jobs/{job}").text
        env_table = re.search(r"<table class='env'>.*?</table>", page)
        assert env_table is not None
        for shown in ("NVIDIA H200", "570.1", "sm_max=1980 MHz", "<th>torch</th>"):
            assert shown in env_table.group(0)
        # the cases that did not pass are listed above the tables, and lead their table
        assert page.index("Not passing (1)") < page.index("<table class='cases")
        statuses = re.findall(r"<tbody class='case' id='[^']+' data-status='(\w+)'", page)
        assert statuses == ["failed", "passed"]
        links = re.findall(r"<a href='(/v1/jobs/[^']+/report\?format=(\w+))'>", page)
        assert sorted({f for _, f in links}) == ["html", "json", "junit", "markdown"]
        starts = {"html": "<!doctype html>", "json": "{", "junit": "<?xml", "markdown": "#"}
        for url, fmt in links:
            r = c.get(url)
            assert r.status_code == 200 and r.text.lstrip().startswith(starts[fmt]), (fmt, r.text)
        assert c.get(links[0][0].split("?")[0]).json()["job_id"] == job


def test_the_history_page_marks_the_regression_against_the_job_before(tmp_path: Path) -> None:
    with _client(tmp_path) as c:
        jobs = [
            finished_job(c, {"branch": "main"}, slow=s, commit=f"commit{i}")
            for i, s in enumerate((1.0, 1.2, 1.2))
        ]
        finished_job(c, {"branch": "pr"}, slow=2.0)  # another branch: not in main's history
        page = c.get("/history", params={"labels": "branch=main", "impl": "te_style"}).text
    data = re.search(r"<script type='application/json' class='history-data'>(.*?)</script>", page)
    assert data is not None
    points = json.loads(data.group(1))["points"]
    assert [p["job_id"] for p in points] == jobs
    assert [p["x"] for p in points] == ["commit0", "commit1", "commit2"]
    assert [p["regressed"]["device_median_ms"] for p in points] == [False, True, False]
    assert [p["regression"] for p in points] == [False, True, False]
    assert "3 finished jobs with branch=main, 1 regression(s) against the job before" in page
    (item,) = re.findall(r"<ul class='regressions'><li>(.*?)</li></ul>", page)
    assert jobs[1] in item and "slower: x1.200" in item


def test_the_history_overview_lists_what_is_broken_now_and_since_when(tmp_path: Path) -> None:
    """#32: "since when" without picking case keys one by one: every case key broken in the
    latest job of a labelled series, with the commit where its run of broken jobs started."""
    with _client(tmp_path) as c:
        finished_job(c, {"branch": "main"}, commit="good1")
        finished_job(c, {"branch": "main"}, commit="bad1", torch_status="failed")
        finished_job(c, {"branch": "main"}, commit="bad2", torch_status="failed")
        finished_job(c, {"branch": "pr"}, commit="other", torch_status="error")
        page = c.get("/history", params={"labels": "branch=main"}).text
        fixed = finished_job(c, {"branch": "main"}, commit="good2")
        after = c.get("/history", params={"labels": "branch=main"}).text
    (table,) = re.findall(r"<table class='broken'>(.*?)</table>", page, re.S)
    rows = re.findall(
        r"<tr><td>(.*?)</td><td class='bad'>(.*?)</td><td>(.*?)</td><td>(\d+)</td>", table, re.S
    )
    assert len(rows) == 1  # te_style passes; the pr branch's error is not main's
    name, what, since, run = rows[0]
    assert "lse_merge.torch" in name and what == "failed" and run == "2"
    assert ">bad1</a>" in since
    assert "Broken now" in after and "nothing" in after and fixed in after


def test_a_token_signs_a_browser_in_for_reads_only(tmp_path: Path) -> None:
    with _client(tmp_path, api_tokens=[WRITE], read_tokens=[READ], open_reads=False) as c:
        page = c.get("/", follow_redirects=False)
        assert page.status_code == 303 and page.headers["location"] == "/login?next=%2F"
        assert c.get("/v1/jobs").status_code == 401
        bad = c.post("/login", data={"token": "nope"}, follow_redirects=False)
        assert bad.status_code == 401 and SESSION_COOKIE not in bad.cookies
        ok = c.post("/login", data={"token": READ, "next": "/history"}, follow_redirects=False)
        assert ok.status_code == 303 and ok.headers["location"] == "/history"
        cookie = ok.headers["set-cookie"]
        assert "HttpOnly" in cookie and "samesite=lax" in cookie.lower()
        assert READ not in cookie  # the token itself is never stored in the browser
        assert c.get("/v1/jobs").status_code == 200
        assert c.get("/", follow_redirects=False).status_code == 200
        assert c.get("/history").status_code == 200
        assert c.get("/docs").status_code == 200
        # a session reads; writing still needs the bearer header (no forged form submits)
        assert c.post("/v1/jobs", json=JOB_SPEC_EXAMPLE).status_code == 401
        c.post("/logout")
        assert c.get("/v1/jobs").status_code == 401
        # only a path on this server as the target (no open redirect)
        away = c.post("/login", data={"token": WRITE, "next": "//evil.example/"})
        assert away.url.path == "/"


def test_sign_out_revokes_the_session_for_a_kept_copy_of_the_cookie(tmp_path: Path) -> None:
    """#31: sign-out only dropped the cookie; a copy of it kept reading."""
    with _client(tmp_path, api_tokens=[WRITE], read_tokens=[READ], open_reads=False) as c:
        ok = c.post("/login", data={"token": READ}, follow_redirects=False)
        value = ok.cookies[SESSION_COOKIE]
        assert c.get("/v1/jobs", cookies={SESSION_COOKIE: value}).status_code == 200
        c.post("/logout", cookies={SESSION_COOKIE: value})
        c.cookies.clear()
        assert c.get("/v1/jobs", cookies={SESSION_COOKIE: value}).status_code == 401
        # signing in again at once gives a new session (its own nonce) that reads
        again = c.post("/login", data={"token": READ}, follow_redirects=False)
        c.cookies.clear()
        fresh = again.cookies[SESSION_COOKIE]
        assert fresh != value
        assert c.get("/v1/jobs", cookies={SESSION_COOKIE: fresh}).status_code == 200


def test_failed_sign_ins_are_rate_limited_per_address(tmp_path: Path) -> None:
    with _client(
        tmp_path, api_tokens=[WRITE], open_reads=False, login_max_failures=3, login_window_s=60
    ) as c:
        for _ in range(3):
            assert c.post("/login", data={"token": "guess"}).status_code == 401
        refused = c.post("/login", data={"token": WRITE}, follow_redirects=False)
        assert refused.status_code == 429 and 0 < int(refused.headers["retry-after"]) <= 60
        assert "too many failed sign-ins" in refused.text


def test_the_login_throttle_window_slides() -> None:
    t = LoginThrottle(limit=2, window_s=10)
    t.failed("a", now=0)
    t.failed("a", now=5)
    assert t.retry_after("a", now=6) == 4  # the first failure leaves the window at 10
    assert t.retry_after("b", now=6) is None  # per address
    assert t.retry_after("a", now=10.5) is None


def test_a_session_ends_with_its_time_or_its_token() -> None:
    s = Settings(api_tokens=[WRITE], read_tokens=[READ], open_reads=False, session_hours=1)
    value, max_age = session_cookie(s, READ, now=1_000_000)
    assert max_age == 3600
    assert valid_session(s, value, now=1_000_000 + 3599)
    assert not valid_session(s, value, now=1_000_000 + 3601)
    revoked = Settings(api_tokens=[WRITE], read_tokens=["another"], open_reads=False)
    assert not valid_session(revoked, value, now=1_000_000)
    expires, _, rest = value.partition(".")
    forged = f"{int(expires) + 10**6}.{rest}"
    assert not valid_session(s, forged, now=1_000_000)
    nonce, _, mac = rest.partition(".")
    assert not valid_session(s, f"{expires}.{'0' * 16}.{mac}", now=1_000_000)
    for junk in ("", "x", "1.2", f"{expires}.{'0' * 64}", f"{expires}.{nonce}.{'0' * 64}"):
        assert not valid_session(s, junk, now=1_000_000)


def test_docs_load_their_assets_from_this_server(tmp_path: Path) -> None:
    with _client(tmp_path) as c:
        for path in ("/docs", "/redoc"):
            text = c.get(path).text
            urls = re.findall(r"""(?:src|href)=["']([^"']+)""", text)
            assert urls and all(u.startswith("/") for u in urls), urls
            for u in urls:
                if u.startswith("/docs-assets/"):
                    assert c.get(u).status_code == 200, u
        redoc = c.get("/docs-assets/redoc.standalone.js").text
        assert "cdn.redoc.ly" not in redoc
        assert c.get("/docs-assets/nothing.js").status_code == 404
        assert c.get("/static/chart-3.9.1.LICENSE.txt").text.count("Chart.js Contributors")
        assert c.get("/static/../settings.py").status_code == 404


def test_openapi_types_the_spec_and_the_report_with_examples(tmp_path: Path) -> None:
    with _client(tmp_path) as c:
        schema = c.get("/openapi.json").json()
    post = schema["paths"]["/v1/jobs"]["post"]
    body = post["requestBody"]["content"]["application/json"]
    assert body["schema"] == {"$ref": "#/components/schemas/JobSpec"}
    JobSpec.model_validate(body["example"])
    report = schema["paths"]["/v1/jobs/{job_id}/report"]["get"]["responses"]["200"]["content"]
    assert report["application/json"]["schema"] == {"$ref": "#/components/schemas/Report"}
    Report.model_validate(report["application/json"]["example"])
    assert "Report" in schema["components"]["schemas"]
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert post["security"] == [{"bearer": []}]
    assert {"bearer": []} in schema["paths"]["/v1/jobs"]["get"]["security"]


def test_the_html_report_is_standalone() -> None:
    example = Report.model_validate(report_example())
    bad = _case(1, {"N": 4}, [_output(max_abs=3e-4, passed=False)])
    report = Report(
        name="x<script>",
        summary=Summary.of([*example.cases, bad]),
        cases=[*example.cases, bad],
        environments=example.environments,
    )
    text = to_html(report)
    assert "x<script>" not in text  # sender text escaped
    assert not re.search(r"""(?:src|href)=["']?https?:""", text)
    assert "Chart.js v3.9.1" in text and "class='plot-data'" in text
    assert "failed limit max_abs" in text


@pytest.mark.parametrize("name", ["kassay.css", "report.js", "live.js", "history.js"])
def test_static_files_are_served(tmp_path: Path, name: str) -> None:
    with _client(tmp_path) as c:
        r = c.get(f"/static/{name}")
        assert r.status_code == 200 and len(r.text) > 100


def test_the_jobs_list_shows_each_jobs_comparison_verdict(tmp_path: Path) -> None:
    with _client(tmp_path) as c:
        finished_job(c, {"branch": "main"})
        gate = {**SPEC, "compare_to": {"labels": {"branch": "main"}}}
        slow = finished_job(c, {"branch": "pr"}, slow=1.2, spec=gate)
        same = finished_job(c, {"branch": "pr"}, spec=gate, commit="same")
        c.get(f"/v1/jobs/{slow}/compare")  # the verdicts are recorded when first asked
        c.get(f"/v1/jobs/{same}/compare")
        page = c.get("/").text
    row = {
        jid: re.search(rf"data-job-id='{jid}'.*?</tr>", page, re.S).group(0) for jid in (slow, same)
    }
    assert "1 regression(s)" in row[slow] and "no regression" in row[same]
