"""What every dashboard page shares: the layout (header, navigation, sign-in state), the
redirect to /login for a browser that may not read, and the page's scripts (served from
/static/, never a CDN)."""

from __future__ import annotations

from urllib.parse import quote

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse

from kassay.api.auth import SESSION_COOKIE, may_read, reads_locked
from kassay.contract.results import STATUSES
from kassay.errors import AuthError
from kassay.reports.escaping import e
from kassay.static import CHART_JS


def login_redirect(request: Request) -> RedirectResponse | None:
    """A redirect to /login (coming back here) when this browser may not read; else None."""
    try:
        allowed = may_read(request)
    except AuthError:
        allowed = False
    if allowed:
        return None
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)


def _nav(request: Request) -> str:
    links = [
        ("/", "Jobs"),
        ("/history", "History"),
        ("/compare", "Compare"),
        ("/docs", "API docs"),
        ("/redoc", "ReDoc"),
        ("/metrics", "Metrics"),
    ]
    items = "".join(f"<a href='{href}'>{text}</a>" for href, text in links)
    session = ""
    if reads_locked(request.app.state.settings):
        if request.cookies.get(SESSION_COOKIE):
            session = (
                "<form method='post' action='/logout' class='right'>"
                "<button type='submit'>Sign out</button></form>"
            )
        else:
            session = "<a class='right' href='/login'>Sign in</a>"
    return f"<header class='top'><a class='brand' href='/'>kassay</a>{items}{session}</header>"


def page(
    request: Request,
    title: str,
    body: str,
    *,
    scripts: tuple[str, ...] = (),
    charts: bool = False,
    status_code: int = 200,
    main_attrs: str = "",
) -> HTMLResponse:
    """A full page: `body` inside the layout; `scripts` from /static/ (Chart.js first when
    `charts`); `main_attrs`: attributes of <main> (already escaped), which scripts read."""
    names = ((CHART_JS,) if charts else ()) + scripts
    tags = "".join(f"<script src='/static/{n}'></script>" for n in names)
    return HTMLResponse(
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{e(title)} · kassay</title><meta name='viewport' content='width=device-width'>"
        "<link rel='icon' href='data:,'>"
        f"<link rel='stylesheet' href='/static/kassay.css'>{tags}</head>"
        # the case statuses, for live.js to count (one list: kassay.contract.results)
        f"<body data-statuses='{' '.join(STATUSES)}'>"
        f"{_nav(request)}<main{main_attrs}>{body}</main></body></html>",
        status_code=status_code,
    )
