"""The dashboard: a plain HTML list of recent jobs with links to their reports."""

from __future__ import annotations

import html
from datetime import datetime, timezone
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.responses import HTMLResponse

from kassay.api.auth import require_read
from kassay.api.deps import Services, services
from kassay.api.store import JobRecord

router = APIRouter(include_in_schema=False)

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse}td,th{padding:.3em .7em;border-bottom:1px solid #ddd;
text-align:left}th{background:#f4f4f4}.passed{color:#1a7f37}.bad{color:#cf222e}
.muted{color:#777}a{color:#0969da}
"""


def _row(j: JobRecord) -> str:
    e = html.escape
    when = datetime.fromtimestamp(j.created_at, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    c = j.counts
    bad = c["failed"] + c["error"] + c["crashed"] + c["timeout"]
    verdict = (
        ""
        if j.ok is None
        else '<span class="passed">ok</span>'
        if j.ok
        else '<span class="bad">not ok</span>'
    )
    labels = ", ".join(f"{e(k)}={e(v)}" for k, v in sorted(j.labels.items()))
    base = f"/v1/jobs/{e(j.id)}"
    links = " ".join(
        f'<a href="{base}/report?format={f}">{f}</a>' for f in ("html", "markdown", "junit", "json")
    )
    return (
        f"<tr><td><a href='{base}'>{e(j.id)}</a></td><td>{e(j.name)}</td>"
        f"<td>{e(j.state)} {verdict}</td><td>{j.done}/{j.total}</td>"
        f"<td>{c['passed']} passed, {c['failed']} failed, {bad - c['failed']} other"
        f"</td><td class='muted'>{labels}</td><td class='muted'>{when}</td>"
        f"<td>{links}</td></tr>"
    )


@router.get("/", response_class=HTMLResponse, dependencies=[Depends(require_read)])
def dashboard(
    svc: Annotated[Services, Depends(services)], limit: Annotated[int, Query(ge=1, le=500)] = 100
) -> HTMLResponse:
    jobs = svc.store.list_jobs(limit=limit)
    workers = svc.dispatcher.workers_info()
    wrows = "".join(
        f"<tr><td>{html.escape(w.address)}</td><td>{html.escape(w.state)}</td>"
        f"<td>{html.escape(w.device_name or w.device or '')}</td>"
        f"<td>{len(w.running)}</td></tr>"
        for w in workers
    )
    rows = "".join(_row(j) for j in jobs) or "<tr><td colspan=8>no jobs yet</td></tr>"
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>kassay</title>
<meta http-equiv="refresh" content="5"><style>{_STYLE}</style></head><body>
<h1>kassay</h1><p class="muted">kernel assay: <a href="/docs">API docs</a> ·
<a href="/v1/workers">workers</a> · <a href="/metrics">metrics</a></p>
<h2>Workers</h2><table><tr><th>address</th><th>state</th><th>device</th><th>running</th></tr>
{wrows or "<tr><td colspan=4>none configured</td></tr>"}</table>
<h2>Jobs</h2><table><tr><th>id</th><th>name</th><th>state</th><th>cases</th><th>results</th>
<th>labels</th><th>created (UTC)</th><th>report</th></tr>{rows}</table></body></html>"""
    return HTMLResponse(page)
