"""The SDK against a mock transport: request shapes, the error tree, retries, SSE following
with fallback to polling, and the CLI's exit codes. No server, no service imports."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from kassay_client import (
    APIConnectionError,
    AsyncClient,
    AuthenticationError,
    Client,
    ConflictError,
    InternalServerError,
    NotFoundError,
    PermissionDeniedError,
    UnprocessableEntityError,
    WaitTimeoutError,
    _base,
    errors,
)
from kassay_client._base import SSEParser, encode_spec
from kassay_client.cli import exit_code


@pytest.fixture(autouse=True)
def _no_sleep(monkeypatch):
    monkeypatch.setattr(_base, "backoff", lambda attempt, response=None: 0.0)
    # the clients' modules (kassay_client._async: the definition, _sync: generated from it)
    import kassay_client._async.client as ac
    import kassay_client._sync.client as cc

    monkeypatch.setattr(cc, "backoff", lambda attempt, response=None: 0.0)
    monkeypatch.setattr(ac, "backoff", lambda attempt, response=None: 0.0)


def job_json(state: str = "queued", done: int = 0, **counts: int) -> dict[str, Any]:
    return {
        "id": "job_1",
        "name": "n",
        "state": state,
        "labels": {},
        "created_at": "2026-12-02T00:00:00Z",
        "progress": {"total": 2, "done": done, **counts},
        "ok": None,
        "links": {"self": "/v1/jobs/job_1"},
    }


CASE = {
    "case_id": "g:torch",
    "group_id": "g",
    "op": "lse_merge",
    "impl": "torch",
    "status": "passed",
}


def sse(*events: tuple[str, str, Any]) -> bytes:
    out = [": ping\n\n"]
    for eid, name, data in events:
        out.append(f"id: {eid}\nevent: {name}\ndata: {json.dumps(data)}\n\n")
    return "".join(out).encode()


def test_create_sends_body_key_and_token():
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(201, json=job_json())

    c = Client("http://k", token="t", transport=httpx.MockTransport(handler))
    job = c.jobs.create({"name": "n", "suites": []}, labels={"ci": "1"})
    assert job.id == "job_1" and job.progress.total == 2
    r = seen[0]
    assert r.headers["authorization"] == "Bearer t"
    assert r.headers["idempotency-key"].startswith("kassay-client-")
    assert r.headers["content-type"] == "application/json"
    assert json.loads(r.content)["labels"] == {"ci": "1"}
    c.jobs.create("name: n\nsuites: []\n", idempotency_key="k")
    assert seen[1].headers["idempotency-key"] == "k"
    assert seen[1].headers["content-type"] == "application/yaml"


def test_encode_spec_merges_labels_into_yaml():
    body, ctype = encode_spec("name: n\nlabels: {a: '1'}\nsuites: []\n", {"b": "2"})
    assert ctype == "application/json" and json.loads(body)["labels"] == {"a": "1", "b": "2"}


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (401, AuthenticationError),
        (403, PermissionDeniedError),
        (404, NotFoundError),
        (409, ConflictError),
        (422, UnprocessableEntityError),
        (500, InternalServerError),
    ],
)
def test_error_tree(status, cls):
    body = {"error": "X", "message": "nope", "details": {"loc": ["suites", 0]}}
    c = Client(
        "http://k",
        transport=httpx.MockTransport(lambda r: httpx.Response(status, json=body)),
        max_retries=0,
    )
    with pytest.raises(cls) as exc:
        c.jobs.get("job_1")
    assert exc.value.status_code == status and exc.value.details == {"loc": ["suites", 0]}
    assert isinstance(exc.value, errors.APIError) and "nope" in str(exc.value)


def test_retries_5xx_and_connection_errors_then_gives_up():
    calls = {"n": 0}

    def flaky(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] == 1:
            raise httpx.ConnectError("refused", request=request)
        if calls["n"] == 2:
            return httpx.Response(503, json={"message": "busy"})
        return httpx.Response(200, json=job_json())

    c = Client("http://k", transport=httpx.MockTransport(flaky), max_retries=2)
    assert c.jobs.get("job_1").id == "job_1" and calls["n"] == 3

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    c = Client("http://k", transport=httpx.MockTransport(down), max_retries=1)
    with pytest.raises(APIConnectionError):
        c.jobs.list()


def test_wait_follows_sse():
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/jobs/job_1/events"
        return httpx.Response(
            200,
            headers={"content-type": "text/event-stream"},
            content=sse(
                ("1", "result", CASE),
                ("2", "result", {**CASE, "case_id": "g:te"}),
                ("2", "final", job_json("finished", 2, passed=2)),
            ),
        )

    got = []
    c = Client("http://k", transport=httpx.MockTransport(handler))
    job = c.jobs.wait("job_1", on_event=got.append)
    assert job.state == "finished" and [e.event for e in got] == ["result", "result", "final"]
    assert [e.id for e in got[:2]] == [1, 2]


def test_wait_resumes_then_falls_back_to_polling():
    calls: list[str] = []
    polls = iter([job_json("running", 1), job_json("finished", 2, passed=1, failed=1)])

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.headers.get("last-event-id", "-"))
        if request.url.path.endswith("/events"):
            if len(calls) == 1:  # one result, then the stream ends early
                return httpx.Response(200, content=sse(("1", "result", CASE)))
            raise httpx.ReadError("reset", request=request)
        return httpx.Response(200, json=next(polls))

    c = Client("http://k", transport=httpx.MockTransport(handler))
    job = c.jobs.wait("job_1", poll_interval=0.0)
    assert job.state == "finished" and exit_code(job) == 1
    assert calls[1] == "1"  # reconnected after event 1


def test_wait_timeout():
    c = Client(
        "http://k",
        transport=httpx.MockTransport(
            lambda r: httpx.Response(
                404 if r.url.path.endswith("events") else 200, json=job_json("running")
            )
        ),
    )
    with pytest.raises(NotFoundError):
        c.jobs.wait("job_1", timeout=0.05)
    c = Client(
        "http://k",
        transport=httpx.MockTransport(
            lambda r: (
                (_ for _ in ()).throw(httpx.ReadError("x", request=r))
                if r.url.path.endswith("events")
                else httpx.Response(200, json=job_json("running"))
            )
        ),
    )
    with pytest.raises(WaitTimeoutError):
        c.jobs.wait("job_1", timeout=0.2, poll_interval=0.01)


def test_report_formats():
    def handler(request: httpx.Request) -> httpx.Response:
        fmt = request.url.params["format"]
        if fmt == "json":
            return httpx.Response(
                200,
                json={
                    "schema_version": "kassay.report/v1",
                    "name": "n",
                    "summary": {"total": 1, "passed": 1},
                    "cases": [CASE],
                },
            )
        return httpx.Response(200, text=f"<{fmt}>")

    c = Client("http://k", transport=httpx.MockTransport(handler))
    assert c.jobs.report("job_1").cases[0].impl == "torch"
    assert c.jobs.report("job_1", format="junit") == "<junit>"
    with pytest.raises(ValueError):
        c.jobs.report("job_1", format="pdf")  # type: ignore[call-overload]


def test_async_client():
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/events"):
            return httpx.Response(
                200,
                content=sse(
                    ("1", "result", CASE), ("1", "final", job_json("finished", 2, passed=2))
                ),
            )
        if request.method == "POST":
            return httpx.Response(201, json=job_json())
        return httpx.Response(200, json={"items": [job_json()], "next_cursor": None})

    async def main() -> None:
        async with AsyncClient("http://k", transport=httpx.MockTransport(handler)) as c:
            job = await c.jobs.create({"name": "n", "suites": []})
            seen = []

            async def on_event(e):
                seen.append(e.event)

            done = await c.jobs.wait(job.id, on_event=on_event)
            assert done.state == "finished" and seen == ["result", "final"]
            assert (await c.jobs.list()).items[0].id == "job_1"

    asyncio.run(main())


def test_exit_codes_and_sse_parser():
    from kassay_client.models import Job

    assert exit_code(Job.model_validate(job_json("finished", 2, passed=2))) == 0
    assert exit_code(Job.model_validate(job_json("finished", 2, passed=1, failed=1))) == 1
    assert exit_code(Job.model_validate(job_json("finished", 2, failed=1, crashed=1))) == 2
    assert exit_code(Job.model_validate(job_json("cancelled", 2, skipped=2))) == 2
    p = SSEParser()
    out = [p.feed(line) for line in ["id: 3", "event: result", "data: a", "data: b", ""]]
    assert out[-1] == ("result", "a\nb", "3")


def test_cli_unreachable_is_exit_3(tmp_path, capsys):
    from kassay.cli import main

    spec = tmp_path / "s.yaml"
    spec.write_text("name: n\nsuites: []\n")
    free = httpx.URL("http://127.0.0.1:9")  # discard port: nothing listens
    assert main(["submit", str(spec), "--server", str(free)]) == 3
    assert "cannot reach" in capsys.readouterr().err


def _artifact_server(seen: list[httpx.Request]) -> httpx.MockTransport:
    """Stores uploads by sha256 (201, then 200) and accepts jobs, recording every request."""
    import hashlib

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/v1/artifacts":
            digest = hashlib.sha256(request.content).hexdigest()
            known = any(
                r.url.path == "/v1/artifacts" and r.content == request.content for r in seen[:-1]
            )
            return httpx.Response(
                200 if known else 201,
                json={
                    "digest": digest,
                    "filename": request.url.params["filename"],
                    "kind": "module",
                    "size": len(request.content),
                    "created_at": "2026-12-02T00:00:00Z",
                },
            )
        return httpx.Response(201, json=job_json("finished", 2, passed=2))

    return httpx.MockTransport(handler)


def test_artifacts_upload_from_both_clients_and_several_from_the_cli(tmp_path, monkeypatch):
    import hashlib

    import kassay_client.cli as cli

    a, b = tmp_path / "mine.py", tmp_path / "other.py"
    a.write_text("def impls():\n    return []\n")
    b.write_text("def impls():\n    return [] \n")
    digests = [hashlib.sha256(p.read_bytes()).hexdigest() for p in (a, b)]
    seen: list[httpx.Request] = []
    with Client("http://k", token="code", transport=_artifact_server(seen)) as c:
        art = c.artifacts.upload(a)
        assert (art.digest, art.filename, art.size) == (digests[0], "mine.py", a.stat().st_size)
        c.jobs.create({"name": "n", "suites": [], "artifacts": [art.digest]}, artifacts=digests)
    up, job = seen
    assert up.method == "POST" and up.url.params["filename"] == "mine.py"
    assert up.content == a.read_bytes() and up.headers["authorization"] == "Bearer code"
    assert up.headers["content-type"] == "application/octet-stream"
    assert json.loads(job.content)["artifacts"] == digests  # merged, each once

    async def upload_async() -> str:
        async with AsyncClient("http://k", transport=_artifact_server(seen)) as ac:
            return (await ac.artifacts.upload(b)).digest

    assert asyncio.run(upload_async()) == digests[1]

    # `kassay submit --artifact A --artifact B`: both uploaded, both named by the job
    seen.clear()
    monkeypatch.setattr(
        cli, "_client", lambda args: Client("http://k", transport=_artifact_server(seen))
    )
    spec = tmp_path / "s.yaml"
    spec.write_text("name: n\nsuites: []\n")
    from kassay.cli import main

    argv = ["submit", str(spec), "--server", "http://k", "--artifact", str(a), "--artifact", str(b)]
    assert main(argv) == 0
    uploads = [r.url.params["filename"] for r in seen if r.url.path == "/v1/artifacts"]
    (job,) = [r for r in seen if r.url.path == "/v1/jobs"]
    assert uploads == ["mine.py", "other.py"] and json.loads(job.content)["artifacts"] == digests
