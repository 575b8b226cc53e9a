"""What a browser needs besides the pages: signing in and out (a session cookie that grants
reads), kassay's static files, and the assets of /docs and /redoc (Swagger UI and ReDoc from
the fastapi-offline package, so the docs work with no network)."""

from __future__ import annotations

import math
from functools import cache
from importlib.util import find_spec
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import FileResponse, RedirectResponse, Response

from kassay.api.auth import (
    SESSION_COOKIE,
    LoginThrottle,
    known_token,
    reads_locked,
    session_cookie,
    sign_out,
)
from kassay.api.pages import page
from kassay.errors import NotFoundError
from kassay.reports.escaping import e
from kassay.static import MEDIA_TYPES, asset

router = APIRouter(include_in_schema=False)

#: the docs assets served under /docs-assets/ (what get_swagger_ui_html and get_redoc_html load)
DOCS_ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "redoc.standalone.js": "text/javascript",
    "favicon.png": "image/png",
}
_CACHE = "public, max-age=3600"


def _safe_next(target: str | None) -> str:
    """Only a path on this server (no scheme, no host, no //): no open redirect."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _login_form(request: Request, target: str, problem: str = "", status: int = 200) -> Response:
    s = request.app.state.settings
    if not reads_locked(s):
        note = "<p>Reads are open on this server: no sign-in needed.</p>"
    else:
        note = (
            "<p class='muted'>Paste a token (a read token is enough). The browser gets a "
            f"session cookie for {s.session_hours:g} h that lets it read; the token itself is "
            "not stored. Submitting and cancelling still need the token in an Authorization "
            "header.</p>"
        )
    body = f"""<div class='login'><h1>Sign in</h1>{note}{problem}
<form method='post' action='/login'><input type='hidden' name='next' value='{e(target)}'>
<label for='token'>token</label><input id='token' name='token' type='password'
 autocomplete='current-password' required autofocus><button type='submit'>Sign in</button>
</form></div>"""
    return page(request, "Sign in", body, status_code=status)


@router.get("/login")
def login_page(request: Request, next: str | None = None) -> Response:
    return _login_form(request, _safe_next(next))


@router.post("/login")
def login(
    request: Request,
    token: Annotated[str, Form(max_length=4096)],
    next: Annotated[str, Form(max_length=2000)] = "/",
) -> Response:
    s = request.app.state.settings
    target = _safe_next(next)
    token = token.strip()
    throttle: LoginThrottle = request.app.state.login_throttle
    who = request.client.host if request.client else "-"
    wait = throttle.retry_after(who)
    if wait is not None:
        problem = (
            f"<p class='error-box'>too many failed sign-ins from this address: try again in "
            f"{math.ceil(wait)} s</p>"
        )
        response = _login_form(request, target, problem, status=429)
        response.headers["Retry-After"] = str(math.ceil(wait))
        return response
    if not known_token(s, token):
        throttle.failed(who)
        problem = "<p class='error-box'>unknown token</p>"
        return _login_form(request, target, problem, status=401)
    value, max_age = session_cookie(s, token)
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        value,
        max_age=max_age,
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


@router.api_route("/logout", methods=["GET", "POST"])
def logout(request: Request) -> Response:
    """Sign out: the cookie is dropped and its session refused from now on by every replica (a
    copy of the cookie kept elsewhere no longer reads)."""
    sign_out(request)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


@router.get("/static/{name}")
def static_file(name: str) -> Response:
    """kassay's own CSS and scripts and the vendored Chart.js (and its license)."""
    if name not in MEDIA_TYPES:
        raise NotFoundError(f"no static file {name!r}")
    return Response(asset(name), media_type=MEDIA_TYPES[name], headers={"Cache-Control": _CACHE})


@cache
def docs_assets_dir() -> Path:
    spec = find_spec("fastapi_offline")
    if spec is None or not spec.submodule_search_locations:
        raise NotFoundError("the docs assets need the fastapi-offline package (kassay[api])")
    return Path(next(iter(spec.submodule_search_locations))) / "static"


#: the one file ReDoc fetches from a CDN (its "API docs by Redocly" logo), served from here
_REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"


@cache
def _redoc_offline() -> bytes:
    text = (docs_assets_dir() / "redoc.standalone.js").read_text(encoding="utf-8")
    return text.replace(_REDOC_LOGO, "/docs-assets/favicon.png").encode()


@router.get("/docs-assets/{name}")
def docs_asset(name: str) -> Response:
    """Swagger UI's and ReDoc's files, from the installed fastapi-offline package."""
    if name not in DOCS_ASSETS:
        raise NotFoundError(f"no docs asset {name!r}")
    headers = {"Cache-Control": _CACHE}
    if name == "redoc.standalone.js":
        return Response(_redoc_offline(), media_type=DOCS_ASSETS[name], headers=headers)
    return FileResponse(docs_assets_dir() / name, media_type=DOCS_ASSETS[name], headers=headers)
