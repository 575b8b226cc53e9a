"""Security settings and rules in-process: the worker token and TLS settings fail fast, a worker
with no authentication stays on loopback, docs/OpenAPI/metrics follow the read rule, and the
bearer check a worker applies."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from kassay.api.app import create_app
from kassay.settings import Settings

pytest.importorskip("grpc")

from kassay.worker.server.access import bearer_ok, exposure_problem, is_loopback

READ, WRITE = "read-token-1", "write-token-1"
LOCKED_PATHS = ["/metrics", "/docs", "/redoc", "/openapi.json", "/v1/workers", "/v1/jobs"]


@pytest.mark.parametrize(
    ("listen", "loopback"),
    [
        ("127.0.0.1:50051", True),
        ("127.3.4.5:1", True),
        ("localhost:50051", True),
        ("[::1]:50051", True),
        ("unix:/tmp/kassay.sock", True),
        ("0.0.0.0:50051", False),
        ("[::]:50051", False),
        (":50051", False),
        ("10.0.0.7:50051", False),
        ("worker-0.kassay-worker:50051", False),
    ],
)
def test_is_loopback(listen: str, loopback: bool) -> None:
    assert is_loopback(listen) is loopback


def test_an_unauthenticated_worker_stays_on_loopback() -> None:
    open_kw = {"token": None, "mtls": False, "allow_unauthenticated": False}
    problem = exposure_problem("0.0.0.0:50051", **open_kw)  # type: ignore[arg-type]
    assert problem and "KASSAY_WORKER_TOKEN" in problem
    assert "KASSAY_WORKER_ALLOW_UNAUTHENTICATED" in problem
    assert exposure_problem("127.0.0.1:50051", **open_kw) is None  # type: ignore[arg-type]
    for kw in ({"token": "x" * 16}, {"mtls": True}, {"allow_unauthenticated": True}):
        assert exposure_problem("0.0.0.0:50051", **{**open_kw, **kw}) is None  # type: ignore[arg-type]


def test_bearer_check() -> None:
    token = "s3cret-token-0123456789"
    assert bearer_ok([("authorization", f"Bearer {token}")], token)
    assert bearer_ok([("x", "y"), ("authorization", f"bearer {token}")], token)
    assert bearer_ok([("authorization", f"Bearer {token}".encode())], token)
    for md in (
        None,
        [],
        [("authorization", token)],  # no scheme
        [("authorization", f"Basic {token}")],
        [("authorization", f"Bearer {token}x")],
        [("authorization", f"Bearer {token[:-1]}")],
        [("x-token", f"Bearer {token}")],
    ):
        assert not bearer_ok(md, token), md


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"KASSAY_WORKER_TOKEN": "short"}, "16 to 4096"),
        ({"KASSAY_WORKER_TOKEN": "with a space in it, long enough"}, "printable ASCII"),
        ({"KASSAY_WORKER_TOKEN": "é" * 20}, "printable ASCII"),
        ({"KASSAY_WORKER_TLS_CERT": "{cert}"}, "worker_tls_cert and worker_tls_key"),
        ({"KASSAY_WORKER_TLS_CLIENT_KEY": "{cert}"}, "worker_tls_client_cert and"),
        ({"KASSAY_WORKER_TLS_CLIENT_CA": "{cert}"}, "needs worker_tls_cert"),
        (
            {"KASSAY_WORKER_TLS_CLIENT_CERT": "{cert}", "KASSAY_WORKER_TLS_CLIENT_KEY": "{cert}"},
            "needs worker_tls_ca",
        ),
        ({"KASSAY_WORKER_TLS_CA": "/no/such/ca.pem"}, "worker_tls_ca"),
        ({"KASSAY_WORKER_ALLOW_UNAUTHENTICATED": "maybe"}, "worker_allow_unauthenticated"),
        ({"KASSAY_MAX_RUN_GROUPS": "0"}, "max_run_groups"),
        ({"KASSAY_MAX_TIMING_BUDGET_S": "-1"}, "max_timing_budget_s"),
    ],
)
def test_bad_security_settings_fail_at_start(
    env: dict[str, str], needle: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert = tmp_path / "c.pem"
    cert.write_text("not read at settings time")
    for k, v in env.items():
        monkeypatch.setenv(k, v.format(cert=cert))
    with pytest.raises(ValidationError) as err:
        Settings()
    assert needle in str(err.value)


def test_good_security_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pem = tmp_path / "x.pem"
    pem.write_text("-")
    for k in ("CERT", "KEY", "CLIENT_CA", "CA", "CLIENT_CERT", "CLIENT_KEY"):
        monkeypatch.setenv(f"KASSAY_WORKER_TLS_{k}", str(pem))
    monkeypatch.setenv("KASSAY_WORKER_TOKEN", "a" * 32)
    s = Settings()
    assert s.worker_token is not None and s.worker_token.get_secret_value() == "a" * 32
    assert "a" * 32 not in repr(s)  # a secret: never in logs or tracebacks


def _client(tmp_path: Path, **kw: object) -> TestClient:
    settings = Settings(database_url=f"sqlite:///{tmp_path}/k.db", **kw)  # type: ignore[arg-type]
    return TestClient(create_app(settings, dispatch=False))


def test_locked_reads_cover_docs_openapi_and_metrics(tmp_path: Path) -> None:
    with _client(tmp_path, api_tokens=[WRITE], read_tokens=[READ], open_reads=False) as c:
        for path in LOCKED_PATHS:
            r = c.get(path)
            assert r.status_code == 401, (path, r.status_code)
            assert c.get(path, headers={"Authorization": "Bearer nope"}).status_code == 401
            for token in (READ, WRITE):
                ok = c.get(path, headers={"Authorization": f"Bearer {token}"})
                assert ok.status_code == 200, (path, ok.text[:200])
        # what the locked pages serve is what the open ones did
        auth = {"Authorization": f"Bearer {READ}"}
        assert "/v1/jobs" in c.get("/openapi.json", headers=auth).json()["paths"]
        assert "swagger-ui" in c.get("/docs", headers=auth).text
        assert "redoc" in c.get("/redoc", headers=auth).text
        assert "kassay_http_requests_total" in c.get("/metrics", headers=auth).text
        # liveness and readiness stay open: probes carry no token
        assert c.get("/healthz").status_code == 200
        assert c.get("/readyz").status_code in (200, 503)


def test_open_reads_leave_docs_openapi_and_metrics_open(tmp_path: Path) -> None:
    with _client(tmp_path, api_tokens=[WRITE], read_tokens=[READ]) as c:
        for path in LOCKED_PATHS:
            assert c.get(path).status_code == 200, path
        schema = c.get("/openapi.json").json()
        assert "JobSpec" in schema["components"]["schemas"]
        # the docs routes are not API operations
        assert not {"/docs", "/redoc", "/openapi.json"} & set(schema["paths"])
