"""The FastAPI app factory: routes, the one error handler for kassay's exception tree, the store
and the dispatcher's lifecycle."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from kassay import __version__
from kassay.api.auth import LoginThrottle
from kassay.api.deps import Services
from kassay.api.fastpath import JobFastPath
from kassay.api.metrics import ApiMetrics, MetricsMiddleware
from kassay.api.notify import JobNotifier
from kassay.api.store import Store
from kassay.api.worker_discovery import Resolver
from kassay.errors import KassayError
from kassay.settings import Settings, get_settings


async def _kassay_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, KassayError)
    return JSONResponse(exc.to_dict(), status_code=exc.http_status)


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
        for e in exc.errors()
    ]
    text = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errors)
    return JSONResponse(
        {
            "error": "InvalidRequestError",
            "message": f"invalid request: {text}",
            "details": {"errors": errors},
        },
        status_code=422,
    )


async def _http_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    name = {404: "NotFoundError", 405: "MethodNotAllowedError"}.get(exc.status_code, "HTTPError")
    return JSONResponse(
        {"error": name, "message": str(exc.detail), "details": {}},
        status_code=exc.status_code,
        headers=exc.headers,
    )


def create_app(
    settings: Settings | None = None, *, dispatch: bool = True, resolver: Resolver | None = None
) -> FastAPI:
    """Build the API. `dispatch=False` leaves the dispatcher idle (tests of the routes alone);
    `resolver` looks up the `dns:///` worker names (default: the system's, getaddrinfo)."""
    from kassay.api.dispatch import Dispatcher
    from kassay.api.routes import artifacts, dashboard, history, jobs, system, web

    settings = settings or get_settings()
    metrics = ApiMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = Store(settings.database_url)
        notifier = JobNotifier()
        dispatcher = Dispatcher(
            store, settings, notifier=notifier, metrics=metrics, resolver=resolver
        )
        app.state.services = Services(
            settings=settings,
            store=store,
            dispatcher=dispatcher,
            notifier=notifier,
            metrics=metrics,
        )
        if dispatch:
            await dispatcher.start()
        try:
            yield
        finally:
            await dispatcher.stop()
            store.close()

    app = FastAPI(
        title="kassay",
        version=__version__,
        lifespan=lifespan,
        # Served by _docs_routes under the read rule instead (FastAPI's own are always open).
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        description="kassay (kernel assay): submit kernel-validation jobs, follow them, "
        "download their reports.",
    )
    app.state.settings = settings
    app.state.login_throttle = LoginThrottle(settings.login_max_failures, settings.login_window_s)
    app.add_middleware(JobFastPath)
    app.add_middleware(MetricsMiddleware, metrics=metrics, access_log=settings.access_log)
    handlers: dict[Any, Any] = {
        KassayError: _kassay_error,
        RequestValidationError: _validation_error,
        StarletteHTTPException: _http_error,
    }
    for exc_class, handler in handlers.items():
        app.add_exception_handler(exc_class, handler)
    app.include_router(jobs.router)
    app.include_router(artifacts.router)
    app.include_router(system.router)
    app.include_router(history.router)
    app.include_router(dashboard.router)
    app.include_router(web.router)
    _publish_spec_schema(app)
    _docs_routes(app)
    return app


def _docs_routes(app: FastAPI) -> None:
    """/openapi.json, /docs and /redoc as FastAPI serves them, but behind require_read: with
    KASSAY_OPEN_READS=false they need a token like every other read (so does /metrics)."""
    from fastapi import Depends
    from fastapi.openapi.docs import (
        get_redoc_html,
        get_swagger_ui_html,
        get_swagger_ui_oauth2_redirect_html,
    )
    from fastapi.responses import HTMLResponse

    from kassay.api.auth import require_read

    locked = [Depends(require_read)]

    @app.get("/openapi.json", include_in_schema=False, dependencies=locked)
    async def openapi_json() -> JSONResponse:
        return JSONResponse(app.openapi())

    # Swagger UI and ReDoc load their files from this server (fastapi-offline's copies): the
    # docs work on a machine with no internet.
    @app.get("/docs", include_in_schema=False, dependencies=locked)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url="/docs/oauth2-redirect",
            swagger_js_url="/docs-assets/swagger-ui-bundle.js",
            swagger_css_url="/docs-assets/swagger-ui.css",
            swagger_favicon_url="/docs-assets/favicon.png",
            # no spec validator badge: it would send the schema's URL to swagger.io
            swagger_ui_parameters={"validatorUrl": None},
        )

    @app.get("/docs/oauth2-redirect", include_in_schema=False, dependencies=locked)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False, dependencies=locked)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url="/openapi.json",
            title=f"{app.title} - ReDoc",
            redoc_js_url="/docs-assets/redoc.standalone.js",
            redoc_favicon_url="/docs-assets/favicon.png",
            with_google_fonts=False,
        )


def _publish_spec_schema(app: FastAPI) -> None:
    """Complete the OpenAPI schema: the job-spec model (POST /v1/jobs reads its body itself,
    JSON or YAML, so FastAPI cannot infer it) and the JSON report (GET .../report renders
    several formats), each with an example; the bearer scheme (and the browser's session
    cookie, which only reads) on every operation."""
    from fastapi.openapi.utils import get_openapi

    from kassay.api.openapi_extras import complete

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            app.openapi_schema = complete(schema)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
