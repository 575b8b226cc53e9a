"""The dashboard in a real browser: headless Chromium (Debian's `chromium`, installed here when
missing) driven by Playwright, against a live `kassay serve` with locked reads, finished jobs
(one with a failing mutant) and a job that runs while the page watches.

Every page is checked for console errors and for requests that leave the machine (none may:
the dashboard, the docs and the HTML report work offline). Screenshots of each page go to a
temporary folder, or with KASSAY_SCREENSHOTS=1 to docs/screenshots/ (shown in README.md)."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.integration

WRITE, READ = "dash-write", "dash-read"
SHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
_TMP_SHOTS = Path(tempfile.gettempdir()) / "kassay-screenshots"
COUNTS = ("passed", "failed", "error", "crashed", "timeout", "unsupported", "skipped", "pending")
TIMING = {"warmup": 1, "min_reps": 2, "max_reps": 3, "budget_s": 0.2}


def _chromium() -> str:
    """Debian's chromium, installed with apt-get when missing (root, as in CI); skip with the
    reason only when it cannot be had."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        pytest.skip("the browser tests need Debian's chromium (apt-get install chromium)")
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium"]):
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if run.returncode != 0 and cmd[1] == "install":
            pytest.skip(f"chromium could not be installed: {run.stderr[-500:]}")
    found = shutil.which("chromium")
    if not found:
        pytest.skip("chromium is not on PATH after apt-get install chromium")
    return found


def _spec(name: str, labels: dict[str, str], **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "labels": labels,
        "suites": [
            {
                "op": "flce",
                "impls": ["torch", "m_label_smoothing_weight"],
                "params": {
                    "N": 16,
                    "H": 32,
                    "V": [64, 96, 128],
                    "dtype": "float32",
                    "label_smoothing": [0.0, 0.1],
                },
                "regimes": ["normal"],
                "coverage": "none",
                "timing": TIMING,
            },
            {
                "op": "lse_merge",
                "impls": ["torch"],
                "params": {"T": 16, "Hh": 2, "D": 8, "K": [2, 3], "dtype": "float32"},
                "regimes": ["normal", "huge"],
                "coverage": "none",
                "timing": TIMING,
            },
        ],
        **extra,
    }


def _running_spec() -> dict[str, Any]:
    # slowable makes 60 extra passes (KASSAY_TEST_EXTRA_PASS below): each group takes a
    # fraction of a second, so the page sees the job move.
    return {
        "name": "dash-live",
        "labels": {"purpose": "live"},
        "suites": [
            {
                "op": "flce",
                "impls": ["torch", "slowable"],
                "params": {"N": list(range(8, 20)), "H": 32, "V": 64, "dtype": "float32"},
                "regimes": ["normal"],
                "coverage": "none",
                "timing": TIMING,
            }
        ],
    }


class Server:
    def __init__(self, url: str, proc: Any) -> None:
        self.url = url
        self.proc = proc
        self.http = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {WRITE}"}, timeout=30
        )

    def submit(self, spec: dict[str, Any]) -> str:
        r = self.http.post("/v1/jobs", json=spec)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def wait(self, job_id: str, timeout: float = 150) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.http.get(f"/v1/jobs/{job_id}").json()
            if job["state"] in ("finished", "cancelled"):
                return dict(job)
            assert self.proc.alive(), self.proc.tail()
            time.sleep(0.3)
        pytest.fail(f"job {job_id} not over in {timeout}s\n{self.proc.tail()}")

    def report(self, job_id: str) -> dict[str, Any]:
        return dict(self.http.get(f"/v1/jobs/{job_id}/report").json())


@pytest.fixture(scope="module")
def server(module_procs: Any) -> Iterator[Server]:
    port = module_procs.free_port()
    proc = module_procs.serve(
        port=port,
        name="dash",
        env={
            "KASSAY_API_TOKENS": WRITE,
            "KASSAY_READ_TOKENS": READ,
            "KASSAY_OPEN_READS": "false",
            "KASSAY_ENABLE_MUTANTS": "true",
            "KASSAY_TEST_EXTRA_PASS": "60",
        },
        args=("--enable-test-impls",),
    )
    srv = Server(f"http://127.0.0.1:{port}", proc)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                ready = srv.http.get("/readyz")
                if ready.status_code == 200 and ready.json().get("workers_up", 0) >= 1:
                    break
            except httpx.HTTPError:
                pass
            assert proc.alive() and time.monotonic() < deadline, proc.tail()
            time.sleep(0.3)
        yield srv
    finally:
        srv.http.close()
        proc.stop()


@pytest.fixture(scope="module")
def jobs(server: Server) -> dict[str, str]:
    """Two finished jobs of one name on branch main (commits aaa, then bbb)."""
    first = server.submit(_spec("dash-flce", {"branch": "main", "commit": "aaa1111"}))
    server.wait(first)
    second = server.submit(_spec("dash-flce", {"branch": "main", "commit": "bbb2222"}))
    server.wait(second)
    return {"first": first, "second": second}


@pytest.fixture(scope="module")
def browser(server: Server) -> Iterator[Any]:
    executable = _chromium()
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (dev dependency)")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


class Watched:
    """A page with its console errors, uncaught exceptions and off-machine requests."""

    def __init__(self, page: Any, base: str) -> None:
        self.page = page
        self.errors: list[str] = []
        self.outside: list[str] = []
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        # not an error by itself (an event stream is cut when the page moves on): it names the
        # URL behind a console error's "Failed to load resource"
        self.failed: list[str] = []
        page.on("requestfailed", lambda r: self.failed.append(f"{r.url} {r.failure}"))

        def route(r: Any) -> None:
            url = r.request.url
            if url.startswith((base, "data:", "file:", "about:")):
                r.continue_()
            else:
                self.outside.append(url)
                r.abort()

        page.route("**/*", route)

    def check(self) -> None:
        assert not self.errors, (self.errors, self.failed)
        assert not self.outside, self.outside


@pytest.fixture
def signed_in(browser: Any, server: Server) -> Iterator[Watched]:
    """A browser context signed in with the read token (reads are locked)."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    w = Watched(page, server.url)
    page.goto(f"{server.url}/")
    assert "/login" in page.url  # locked reads: sent to sign in first
    page.fill("#token", READ)
    page.click("button[type=submit]")
    page.wait_for_url(f"{server.url}/")
    yield w
    w.check()
    context.close()


def _shot(page: Any, name: str) -> None:
    """Taken on every run (a page that cannot be drawn fails here); kept in the repository's
    docs/ only when asked, so a test run leaves the working tree as it found it."""
    folder = SHOTS if os.environ.get("KASSAY_SCREENSHOTS") == "1" else _TMP_SHOTS
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / f"{name}.png"), full_page=False)


RENDERED_POINTS = """() => window.kassayCharts.map(c => ({
  suite: c.suite, plot: c.plot,
  points: c.chart.data.datasets.reduce((n, d, i) => d.model || d.band ? n :
    n + c.chart.getDatasetMeta(i).data.filter(e => isFinite(e.x) && isFinite(e.y)).length, 0)
}))"""


def _expected_points(report: dict[str, Any]) -> dict[tuple[int, str], int]:
    """Cases per suite that each plot must show: a finite error, a throughput, a peak."""
    out: dict[tuple[int, str], int] = {}
    suites = sorted({c["suite_index"] for c in report["cases"]})
    for i, s in enumerate(suites):
        cases = [c for c in report["cases"] if c["suite_index"] == s]
        out[(i, "error")] = sum(
            any(math.isfinite(o["rel_l2"]) for o in c["outputs"]) for c in cases
        )
        out[(i, "memory")] = sum(
            bool(c["memory"] and c["memory"]["peak_extra_bytes"] is not None) for c in cases
        )
        out[(i, "speed")] = sum(
            bool(c["timing"] and (c["timing"]["tflops"] or c["timing"]["gbps"])) for c in cases
        )
    return out


def test_jobs_page_counts_add_up_and_filter_by_label(
    signed_in: Watched, server: Server, jobs: dict[str, str]
) -> None:
    page = signed_in.page
    page.goto(f"{server.url}/")
    rows = page.locator("tr[data-job-id]")
    assert rows.count() >= 2
    for i in range(rows.count()):
        row = rows.nth(i)
        counts = [int(row.locator(f"td[data-count='{k}']").inner_text()) for k in COUNTS]
        assert sum(counts) == int(row.get_attribute("data-job-total"))
    page.fill("input[name=label]", "commit=aaa1111")
    page.click("form.filters button")
    page.wait_for_url("**/?*label=commit*")
    assert page.locator("tr[data-job-id]").count() == 1
    assert page.locator(f"tr[data-job-id='{jobs['first']}']").count() == 1
    page.goto(f"{server.url}/")
    _shot(page, "jobs")


def test_job_page_plots_points_and_failed_limit(
    signed_in: Watched, server: Server, jobs: dict[str, str]
) -> None:
    page = signed_in.page
    job_id = jobs["second"]
    report = server.report(job_id)
    page.goto(f"{server.url}/jobs/{job_id}")
    page.wait_for_function("window.kassayCharts && window.kassayCharts.length === 4")
    rendered = {(c["suite"], c["plot"]): c["points"] for c in page.evaluate(RENDERED_POINTS)}
    expected = _expected_points(report)
    # a CPU worker measures no peak memory: no memory chart at all (no empty charts)
    assert {k: n for k, n in expected.items() if k[1] != "memory"} == rendered
    assert all(n == 0 for k, n in expected.items() if k[1] == "memory")
    assert all(n > 0 for n in rendered.values())
    # error on a log axis; speed in TFLOP/s or GB/s, with the roofline fraction a menu choice
    axes = page.evaluate(
        "() => window.kassayCharts.map(c => [c.plot, c.chart.options.scales.y.type,"
        " c.chart.options.scales.y.title.text])"
    )
    assert {t for p, t, _ in axes if p == "error"} == {"logarithmic"}
    # the natural unit per op (Op.speed_unit): flce in TFLOP/s, the memory-bound lse_merge in
    # GB/s (TFLOP/s drew it flat at 0)
    assert [y for p, _, y in axes if p == "speed"] == ["TFLOP/s", "GB/s"]
    # an exact result (rel-L2 0) sits on a tick that says so, not at 1e-18
    ticks = page.evaluate(
        "() => window.kassayCharts.filter(c => c.plot === 'error')"
        ".map(c => c.chart.scales.y.ticks.map(t => t.label))"
    )
    assert all("1e-18" not in t for ts in ticks for t in ts), ticks
    menus = page.locator("select[aria-label='speed metric']")
    assert menus.count() == 2 and "% of roofline" in menus.first.inner_text()
    # only what varies within the flce suite gets a column: V and label_smoothing, not N or H
    heads = page.locator("section.suite[data-suite='0'] table.cases thead th").all_inner_texts()
    assert "V" in heads and "label_smoothing" in heads
    assert "N" not in heads and "H" not in heads and "dtype" not in heads
    # so the error and timing columns are on screen at 1400 px
    right = page.evaluate(
        """() => Array.from(document.querySelectorAll("table.cases thead th"))
          .filter(th => ["rel-L2", "max-abs", "ms"].includes(th.textContent))
          .map(th => th.getBoundingClientRect().right)"""
    )
    assert len(right) == 6 and max(right) <= 1400, right
    # failures first: the first row is the mutant's failure; its expansion names the limits
    failed = [c for c in report["cases"] if c["status"] == "failed"]
    assert failed, "the mutant fails with label smoothing"
    first = page.locator("section.suite[data-suite='0'] tbody.case").first
    assert first.get_attribute("data-status") == "failed"
    case = next(c for c in failed if f"case-{c['case_id']}" == first.get_attribute("id"))
    first.locator("tr.row").click()
    detail = first.locator("tr.detail")
    assert detail.is_visible()
    text = detail.inner_text()
    broke = [
        (o["name"], m)
        for o in case["outputs"]
        if not o["passed"]
        for m in ("max_abs", "rel_l2")
        if o[f"threshold_{m}"] is not None and o[m] > o[f"threshold_{m}"]
    ]
    assert broke
    for name, metric in broke:
        assert f"{metric} " in text and name in text
    for o in case["outputs"]:
        for m in ("max_abs", "rel_l2"):
            if o["passed"] or (o[f"threshold_{m}"] is not None and o[m] <= o[f"threshold_{m}"]):
                assert f"{o['name']}: failed limit {m}" not in text
    assert "failed limit" in text
    _shot(page, "job")
    # a click on a column's head sorts the cases by it (V numerically: 64 before 128), a second
    # click reverses
    col = heads.index("V")
    head = page.locator(f"section.suite[data-suite='0'] table.cases thead th[data-col='{col}']")
    column = """c => Array.from(document.querySelectorAll(
      "section.suite[data-suite='0'] tbody.case")).map(b => Number(b.rows[0].cells[c].dataset.v))"""
    head.click()
    up = page.evaluate(column, col)
    assert up == sorted(up) and len(set(up)) == 3, up
    head.click()
    assert page.evaluate(column, col) == sorted(up, reverse=True)


def test_live_progress_without_reload(
    signed_in: Watched, server: Server, jobs: dict[str, str]
) -> None:
    page = signed_in.page
    job_id = server.submit(_running_spec())
    page.goto(f"{server.url}/jobs/{job_id}")
    page.evaluate("window.__noReload = 1")
    start = page.locator("[data-done]").first.inner_text()
    total = int(start.split("/")[1])
    page.wait_for_function(
        "s => document.querySelector('[data-done]').textContent !== s", arg=start, timeout=60_000
    )
    page.wait_for_selector("tbody.case", timeout=30_000)  # the cases re-read while it runs
    _shot(page, "job-running")
    page.wait_for_function(
        f"document.querySelector('[data-done]').textContent === '{total}/{total}'",
        timeout=120_000,
    )
    page.wait_for_function(
        "document.querySelector('[data-state]').textContent.startsWith('finished')"
    )
    # the case tables were re-read: every case of the job is on the page, plots included
    page.wait_for_function(f"document.querySelectorAll('tbody.case').length === {total}")
    assert page.evaluate("window.__noReload") == 1  # the same document all along
    assert page.evaluate("performance.getEntriesByType('navigation').length") == 1


def test_jobs_list_follows_a_running_job(
    signed_in: Watched, server: Server, jobs: dict[str, str]
) -> None:
    page = signed_in.page
    job_id = server.submit(_running_spec())
    page.goto(f"{server.url}/?name=dash-live")
    page.evaluate("window.__noReload = 1")
    row = page.locator(f"tr[data-job-id='{job_id}']")
    total = int(row.get_attribute("data-job-total"))
    page.wait_for_function(
        f"document.querySelector(\"tr[data-job-id='{job_id}'] [data-done]\").textContent"
        f" === '{total}/{total}'",
        timeout=120_000,
    )
    assert row.locator("[data-state]").inner_text().startswith("finished")
    assert int(row.locator("td[data-count='passed']").inner_text()) == total
    assert page.evaluate("window.__noReload") == 1


def test_history_and_compare_pages(
    signed_in: Watched, server: Server, jobs: dict[str, str]
) -> None:
    page = signed_in.page
    page.goto(f"{server.url}/history?labels=branch=main&op=flce&impl=torch&shape=V=96")
    page.wait_for_function("window.kassayCharts && window.kassayCharts.length === 3")
    rendered = {c["plot"]: c["points"] for c in page.evaluate(RENDERED_POINTS)}
    cases = server.report(jobs["second"])["cases"]
    measured = any(c["memory"] and c["memory"]["peak_extra_bytes"] is not None for c in cases)
    assert rendered == {"device_median_ms": 2, "rel_l2": 2, "peak_bytes": 2 if measured else 0}
    assert "2 finished jobs" in page.locator("main").inner_text()
    _shot(page, "history")
    page.goto(f"{server.url}/compare?a={jobs['second']}&b={jobs['first']}")
    text = page.locator("main").inner_text()
    assert f"{jobs['first']}" in text and "regression" in text
    compared = int(page.locator("[data-count='compared']").inner_text())
    assert compared == len(server.report(jobs["second"])["cases"])
    _shot(page, "compare")


def test_docs_and_html_report_work_offline(
    signed_in: Watched, server: Server, jobs: dict[str, str], tmp_path: Path
) -> None:
    page = signed_in.page
    page.goto(f"{server.url}/docs")
    page.wait_for_selector(".swagger-ui .info .title", timeout=30_000)
    page.goto(f"{server.url}/redoc")
    page.wait_for_selector("redoc .api-info, [role=search], h1", timeout=30_000)
    # the downloadable report, opened from disk with every request outside refused
    html = server.http.get(f"/v1/jobs/{jobs['second']}/report?format=html").text
    path = tmp_path / "report.html"
    path.write_text(html)
    page.goto(path.as_uri())
    page.wait_for_function("window.kassayCharts && window.kassayCharts.length === 4")
    first = page.locator("tbody.case[data-status='failed']").first
    first.locator("tr.row").click()
    assert "failed limit" in first.locator("tr.detail").inner_text()
    _shot(page, "report-html")


def test_pages_fit_1440_px_and_failures_come_first(
    browser: Any, server: Server, jobs: dict[str, str], tmp_path: Path
) -> None:
    """#32: the first screen answers it: no horizontal scroll at a 1,440 px window on the jobs
    list, a job page, the HTML report and /history; on a job page the failures come before the
    suites, the comparison and the environment."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    w = Watched(page, server.url)
    page.goto(f"{server.url}/login")
    page.fill("#token", READ)
    page.click("button[type=submit]")
    html = server.http.get(f"/v1/jobs/{jobs['second']}/report?format=html").text
    report_file = tmp_path / "report.html"
    report_file.write_text(html)
    urls = [
        f"{server.url}/",
        f"{server.url}/jobs/{jobs['second']}",
        report_file.as_uri(),
        f"{server.url}/history?labels=branch=main",
    ]
    wide = {}
    for url in urls:
        page.goto(url)
        page.wait_for_load_state("load")
        wide[url] = page.evaluate("() => document.documentElement.scrollWidth")
    assert all(v <= 1440 for v in wide.values()), wide
    page.goto(f"{server.url}/jobs/{jobs['second']}")
    order = page.evaluate(
        """() => ["section.failures", "section.suite", "h2"].map(s => {
          const el = Array.from(document.querySelectorAll(s)).find(x =>
            s !== "h2" || x.textContent === "Environment");
          return el ? el.getBoundingClientRect().top + window.scrollY : null; })"""
    )
    assert order[0] is not None and order[0] < order[1] < order[2], order
    _shot(page, "job-first-screen")
    page.goto(f"{server.url}/history?labels=branch=main")
    assert "Broken now" in page.locator("main").inner_text()
    _shot(page, "history-overview")
    w.check()
    context.close()


def test_sign_out_locks_the_pages_again(signed_in: Watched, server: Server) -> None:
    page = signed_in.page
    page.goto(f"{server.url}/")
    page.click("form[action='/logout'] button")
    page.wait_for_url("**/login")
    page.goto(f"{server.url}/history")
    assert "/login" in page.url
    r = page.request.get(f"{server.url}/v1/jobs")
    assert r.status == 401
