"""The dashboard: server-rendered pages with small scripts (served from /static/).

- `/`: jobs, filtered by state, name and labels, paged; active jobs move live (SSE).
- `/jobs/{id}`: summary, environment, failures first, per-suite case tables and plots; live
  while the job runs (`/jobs/{id}/cases` is the part it re-reads).
- `/history`: one case key's device time, error and memory over jobs, regressions marked.
- `/compare?a=&b=`: a job against another (or the latest with labels), as a page.

A browser that may not read (KASSAY_OPEN_READS=false, not signed in) is sent to /login."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, Response

from kassay.api.comparisons import compare, report_with_verdict, series_breaks
from kassay.api.deps import Services, services
from kassay.api.history_view import keyed_choices, point_label, series_points
from kassay.api.pages import login_redirect, page
from kassay.api.route_common import label_filters
from kassay.api.store import ACTIVE_STATES, JobRecord
from kassay.errors import KassayError
from kassay.reports import FORMATS
from kassay.reports.comparison_html import comparison_html
from kassay.reports.escaping import e, json_for_script
from kassay.reports.html import (
    COUNTED,
    counts_line,
    environment_table,
    failures_list,
    regressions_list,
    suite_sections,
)
from kassay.validate.compare_reports import job_device_kinds

router = APIRouter(include_in_schema=False)

STATES = ("queued", "running", "finished", "cancelled")
#: the report links of a job: every format of the registry, the page-like one first
REPORT_FORMATS = tuple(sorted(FORMATS, key=lambda f: f != "html"))


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _verdict(j: JobRecord) -> str:
    if j.ok is None:
        return e(j.state)
    return f"{e(j.state)} · {'ok' if j.ok else 'not ok'}"


def _verdict_class(j: JobRecord) -> str:
    return "" if j.ok is None else "ok" if j.ok else "bad"


def _progress(done: int, total: int) -> str:
    width = 100 * done / total if total else 0
    return (
        f"<span class='progress'><span style='width:{width:.1f}%'></span></span> "
        f"<span data-done>{done}/{total}</span>"
    )


def _report_links(job_id: str) -> str:
    return " ".join(
        f"<a href='/v1/jobs/{e(job_id)}/report?format={f}'>{f}</a>" for f in REPORT_FORMATS
    )


def _vs(j: JobRecord, regressions: dict[str, int | None]) -> str:
    """The jobs list's comparison cell: the verdict of the job's compare_to, if it recorded one
    (`regressions`: History.regression_counts of the page)."""
    if j.state in ACTIVE_STATES or j.id not in regressions:
        return "<td class='muted'>-</td>"
    link = f"/compare?a={e(j.id)}"
    n = regressions[j.id]
    if n is None:
        return "<td class='muted'>none yet</td>"
    if not n:
        return f"<td class='ok'><a href='{link}'>no regression</a></td>"
    return f"<td class='bad'><a href='{link}'>{n} regression(s)</a></td>"


def _job_row(j: JobRecord, filters: dict[str, str], regressions: dict[str, int | None]) -> str:
    c = j.counts
    active = " data-active" if j.state in ACTIVE_STATES else ""
    counts = "".join(
        f"<td data-count='{k}' class='{k if c[k] else 'muted'}'>{c[k]}</td>" for k in COUNTED
    )
    label_links = " ".join(
        f"<a class='muted' href='/?{urlencode({**filters, 'label': f'{k}={v}'})}'>{e(k)}={e(v)}</a>"
        for k, v in sorted(j.labels.items())
    )
    return (
        f"<tr data-job-id='{e(j.id)}' data-job-state='{e(j.state)}' data-job-done='{j.done}' "
        f"data-job-total='{j.total}'{active}><td><a href='/jobs/{e(j.id)}'>{e(j.id)}</a></td>"
        f"<td>{e(j.name)}</td><td><span data-state class='{_verdict_class(j)}'>{_verdict(j)}"
        f"</span></td><td>{_progress(j.done, j.total)}</td>{counts}"
        f"<td data-count='pending'>{j.total - j.done}</td>{_vs(j, regressions)}<td>{label_links}</td>"
        f"<td class='muted'>{_when(j.created_at)}</td><td>{_report_links(j.id)}</td></tr>"
    )


@router.get("/", response_class=HTMLResponse)
def jobs_page(
    request: Request,
    svc: Annotated[Services, Depends(services)],
    state: str | None = None,
    name: Annotated[str | None, Query(max_length=200)] = None,
    label: Annotated[list[str], Query()] = [],  # noqa: B006
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(pattern=r"^[0-9]{1,18}$")] = None,
) -> Response:
    if (redirect := login_redirect(request)) is not None:
        return redirect
    state = state if state in STATES else None
    label = [x for x in label if x.strip()]
    try:
        labels = label_filters(label)
    except KassayError as exc:
        labels, label = {}, []
        problem = f"<p class='error-box'>{e(exc.message)}</p>"
    else:
        problem = ""
    rows = svc.store.jobs.list_jobs(
        state=state,
        labels=labels,
        name=name or None,
        limit=limit + 1,
        before=int(cursor) if cursor else None,
    )
    more, rows = len(rows) > limit, rows[:limit]
    filters = {k: v for k, v in (("state", state), ("name", name)) if v}
    filters_with_label = [*filters.items(), *(("label", x) for x in label)]
    regressions = svc.store.history.regression_counts([j.id for j in rows])
    body_rows = "".join(_job_row(j, filters, regressions) for j in rows)
    if not body_rows:
        body_rows = "<tr><td colspan='15'>no jobs match</td></tr>"
    pager = []
    if cursor:
        pager.append(f"<a href='/?{urlencode(filters_with_label)}'>« newest</a>")
    if more and rows:
        older = urlencode([*filters_with_label, ("cursor", str(rows[-1].seq))])
        pager.append(f"<a href='/?{older}' rel='next'>older »</a>")
    options = "".join(
        f"<option value='{s}'{' selected' if s == state else ''}>{s}</option>" for s in STATES
    )
    workers = svc.dispatcher.workers.info()
    wrows = "".join(
        f"<tr><td>{e(w.address)}</td><td class='{'ok' if w.state == 'up' else 'bad'}'>"
        f"{e(w.state)}</td><td>{e(w.device_name or w.device or '')}</td>"
        f"<td>{len(w.running)}</td></tr>"
        for w in workers
    )
    short = {"unsupported": "unsup.", "timeout": "t/o", "crashed": "crash", "pending": "pend."}
    heads = "".join(f"<th title='{k}'>{short.get(k, k)}</th>" for k in (*COUNTED, "pending"))
    body = f"""<h1>Jobs</h1>
<form class='filters' method='get' action='/'>
<label>state<select name='state'><option value=''>any</option>{options}</select></label>
<label>name<input name='name' value='{e(name or "")}' placeholder='exact name'></label>
<label>label<input name='label' value='{e(label[0] if label else "")}'
 placeholder='branch=main'></label>
<button type='submit'>Filter</button> <a href='/'>clear</a></form>{problem}
<table class='jobs'><thead><tr><th>id</th><th>name</th><th>state</th><th>progress</th>{heads}
<th title='the verdict of the job's compare_to'>vs</th><th>labels</th><th>created (UTC)</th><th>reports</th></tr></thead><tbody>{body_rows}</tbody>
</table><p class='pager'>{" ".join(pager)}</p>
<h2>Workers</h2><table><tr><th>address</th><th>state</th><th>device</th><th>running</th></tr>
{wrows or "<tr><td colspan='4'>none configured</td></tr>"}</table>"""
    return page(request, "Jobs", body, scripts=("live.js",))


def _cases_fragment(report_html: str, failures: str) -> str:
    return failures + report_html


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(
    job_id: str, request: Request, svc: Annotated[Services, Depends(services)]
) -> Response:
    if (redirect := login_redirect(request)) is not None:
        return redirect
    try:
        job = svc.store.jobs.require_job(job_id, full=True)
        report = report_with_verdict(svc.store, job_id)
    except KassayError as exc:
        return page(request, "Not found", f"<h1>{e(exc.message)}</h1>", status_code=404)
    active = job.state in ACTIVE_STATES
    labels = " · ".join(
        f"<a href='/?{urlencode({'label': f'{k}={v}'})}'>{e(k)}={e(v)}</a>"
        for k, v in sorted(job.labels.items())
    )
    compare_link = ""
    if job.spec.get("compare_to"):
        compare_link = f" · <a href='/compare?a={e(job.id)}'>comparison (compare_to)</a>"
    comparison = regressions = ""
    if report.comparison is not None:
        comparison = "<h2>Comparison</h2>" + comparison_html(report.comparison)
        regressions = regressions_list(report)
    # the job's counters, not the report's: what has no result yet shows as pending
    counts = counts_line(job.counts, job.total)
    body = f"""<h1>{e(job.name)} <span class='muted'>{e(job.id)}</span></h1>
<p><span data-state class='{_verdict_class(job)}'>{_verdict(job)}</span> ·
{_progress(job.done, job.total)} · created {_when(job.created_at)} UTC · finished
{_when(job.finished_at)} · {labels}</p>
<p class='summary'>{counts}</p>
<p>reports: {_report_links(job.id)} · <a href='/compare?a={e(job.id)}'>compare…</a>{compare_link}</p>
{regressions}<div id='cases' data-fragment='/jobs/{e(job.id)}/cases'>
{_cases_fragment(suite_sections(report), failures_list(report))}</div>
{comparison}<h2>Environment</h2>{environment_table(report)}"""
    attrs = (
        f" data-job-id='{e(job.id)}' data-job-state='{e(job.state)}' data-job-done='{job.done}'"
        f" data-job-total='{job.total}'" + (" data-active" if active else "")
    )
    return page(
        request,
        job.name,
        body,
        scripts=("report.js", "live.js"),
        charts=True,
        main_attrs=attrs,
    )


@router.get("/jobs/{job_id}/cases", response_class=HTMLResponse)
def job_cases_fragment(
    job_id: str, request: Request, svc: Annotated[Services, Depends(services)]
) -> Response:
    """The failures and the suites of a job page, re-read by live.js while the job runs."""
    if login_redirect(request) is not None:
        return HTMLResponse("sign in first", status_code=401)
    try:
        report = svc.store.results.report(job_id)
    except KassayError as exc:
        return HTMLResponse(e(exc.message), status_code=exc.http_status)
    return HTMLResponse(_cases_fragment(suite_sections(report), failures_list(report)))


def _key_select(choices: list[tuple[str, str]], key: str | None) -> str:
    opts = "".join(
        f"<option value='{e(k)}'{' selected' if k == key else ''}>{e(text)}</option>"
        for k, text in choices
    )
    return f"<select name='key' id='key'>{opts}</select>" if choices else ""


@router.get("/history", response_class=HTMLResponse)
def history_page(
    request: Request,
    svc: Annotated[Services, Depends(services)],
    key: Annotated[str | None, Query(pattern=r"^(ck_[0-9a-f]{24})?$")] = None,
    job: Annotated[str | None, Query(max_length=40)] = None,
    op: Annotated[str | None, Query(max_length=100)] = None,
    impl: Annotated[str | None, Query(max_length=200)] = None,
    shape: Annotated[str | None, Query(max_length=200)] = None,
    labels: Annotated[str, Query(max_length=500)] = "",
    limit: Annotated[int, Query(ge=2, le=1000)] = 100,
) -> Response:
    """Pick a case key directly, or from the cases of a job (by default the latest finished one
    with the labels) narrowed by op, impl and a shape text (e.g. "V=200")."""
    if (redirect := login_redirect(request)) is not None:
        return redirect
    problem = ""
    try:
        wanted = label_filters([x.strip() for x in labels.split(",") if x.strip()])
    except KassayError as exc:
        wanted, problem = {}, f"<p class='error-box'>{e(exc.message)}</p>"
    ref = None
    if job:
        ref = svc.store.jobs.get_job(job)
        if ref is None:
            problem += f"<p class='error-box'>no job {e(job)}</p>"
    else:
        found = svc.store.jobs.list_jobs(state="finished", labels=wanted, limit=1)
        ref = found[0] if found else None
    choices: list[tuple[str, str]] = []
    if ref is not None:
        report = svc.store.results.report(ref.id)
        for k, c in keyed_choices(report, job_device_kinds(report)):
            if (op and c.op != op) or (impl and c.impl != impl):
                continue
            text = f"{c.name or f'{c.op}.{c.impl} {c.label()}'} {c.dtype}"
            if shape and shape.replace(" ", "") not in text.replace(" ", ""):
                continue
            choices.append((k, text))
    if not key and choices:
        key = choices[0][0]
    points = series_points(svc.store.history.series(key, labels=wanted, limit=limit)) if key else []
    regressions = [p for p in points if p["regression"]]
    reg_list = "".join(
        f"<li><a href='/jobs/{e(p['job_id'])}'>{e(p['x'])}</a>: {e('; '.join(p['reasons']))}</li>"
        for p in regressions
    )
    form = f"""<form class='filters' method='get' action='/history'>
<label>labels<input name='labels' value='{e(labels)}' placeholder='branch=main'></label>
<label>cases of job<input name='job' value='{e(job or "")}' placeholder='latest with labels'>
</label><label>op<input name='op' value='{e(op or "")}' size='8'></label>
<label>impl<input name='impl' value='{e(impl or "")}' size='10'></label>
<label>shape<input name='shape' value='{e(shape or "")}' placeholder='V=200' size='10'></label>
<label>case key{_key_select(choices, key) or f"<input name='key' value='{e(key or '')}'>"}
</label><button type='submit'>Show</button></form>"""
    if not key:
        summary = "<p class='muted'>no case to show: no finished job matches</p>"
    else:
        summary = (
            f"<p>case key <code>{e(key)}</code>: {len(points)} finished jobs"
            + (f" with {e(labels)}" if labels else "")
            + f", {len(regressions)} regression(s) against the job before</p>"
            + (f"<ul class='regressions'>{reg_list}</ul>" if reg_list else "")
        )
    plots = (
        "<div class='plots'>"
        + "".join(
            f"<figure class='wide'><canvas data-plot='{m}'></canvas></figure>"
            for m in ("device_median_ms", "rel_l2", "peak_bytes")
        )
        + "</div>"
        + f"<script type='application/json' class='history-data'>"
        f"{json_for_script({'key': key, 'points': points})}</script>"
        if points
        else ""
    )
    overview = _broken_overview(svc, wanted, labels) if wanted else ""
    body = f"<h1>History</h1>{form}{problem}{overview}{summary}{plots}"
    return page(request, "History", body, scripts=("history.js",), charts=bool(points))


#: how many of a series' latest jobs the overview reads to find where a break started
OVERVIEW_DEPTH = 20


def _broken_overview(svc: Services, wanted: dict[str, str], labels: str) -> str:
    """What is broken in the latest finished job with these labels, and since when."""
    jobs, rows = series_breaks(svc.store, wanted, OVERVIEW_DEPTH)
    if not jobs:
        return ""
    latest = jobs[0]
    head = (
        f"<h2>Broken now</h2><p>in the latest finished job with {e(labels)}: "
        f"<a href='/jobs/{e(latest.id)}'>{e(point_label(latest.labels, latest.id))}</a>"
    )
    if not rows:
        return head + " — nothing</p>"
    items = "".join(
        f"<tr><td><a href='/history?{urlencode({'labels': labels, 'key': r['key']})}'>"
        f"{e(r['name'])}</a></td><td class='bad'>{e(r['what'])}</td><td>"
        f"<a href='/jobs/{e(r['since_job'] or '')}'>{e(r['since'])}</a>"
        f"{' (or earlier)' if r['all'] else ''}</td><td>{r['jobs']}</td></tr>"
        for r in rows
    )
    return (
        head + f" — {len(rows)} case key(s)</p><table class='broken'><tr><th>case</th>"
        f"<th>what</th><th>since</th><th>jobs in a row</th></tr>{items}</table>"
    )


@router.get("/compare", response_class=HTMLResponse)
async def compare_page(
    request: Request,
    svc: Annotated[Services, Depends(services)],
    a: Annotated[str | None, Query(max_length=40)] = None,
    b: Annotated[str | None, Query(max_length=40)] = None,
    to_labels: Annotated[str, Query(max_length=500)] = "",
    threshold: Annotated[float | None, Query(gt=0, le=10)] = None,
) -> Response:
    """Job `a` against job `b`, or against the latest finished job with `to_labels`; with
    neither, the comparison `a`'s spec asks for."""
    if (redirect := login_redirect(request)) is not None:
        return redirect
    form = f"""<form class='filters' method='get' action='/compare'>
<label>job<input name='a' value='{e(a or "")}' required></label>
<label>against job<input name='b' value='{e(b or "")}'></label>
<label>or the latest with labels<input name='to_labels' value='{e(to_labels)}'
 placeholder='branch=main'></label>
<label>threshold<input name='threshold' value='{e(threshold or "")}' placeholder='0.03'
 size='6'></label><button type='submit'>Compare</button></form>"""
    result = ""
    if a:
        try:
            wanted = label_filters([x.strip() for x in to_labels.split(",") if x.strip()])
            cmp = await run_in_threadpool(
                compare,
                svc.store,
                a,
                to=b or None,
                to_labels=wanted or None,
                threshold=threshold,
            )
            result = comparison_html(cmp)
        except KassayError as exc:
            result = f"<p class='error-box'>{e(exc.message)}</p>"
    body = f"<h1>Compare</h1>{form}{result}"
    return page(request, "Compare", body)
