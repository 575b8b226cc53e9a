"""The synchronous client.

from kassay_client import Client

with Client("http://127.0.0.1:8000", token="...") as client:
    job = client.jobs.create(Path("examples/smoke.yaml"))
    job = client.jobs.wait(job.id, timeout=600)
    print(client.jobs.report(job.id, format="markdown"))
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, overload

import httpx

from kassay_client._base import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_TIMEOUT,
    REPORT_MEDIA,
    RETRY_STATUSES,
    SpecInput,
    SSEParser,
    artifact_upload,
    backoff,
    compare_params,
    default_headers,
    encode_spec,
    list_params,
    new_idempotency_key,
    request_of,
    resolve_base_url,
    series_params,
    to_event,
)
from kassay_client.errors import (
    APIConnectionError,
    APITimeoutError,
    WaitTimeoutError,
    status_error,
)
from kassay_client.models import (
    Artifact,
    Comparison,
    Job,
    JobEvent,
    JobPage,
    Report,
    Series,
    Worker,
)

EventCallback = Callable[[JobEvent], None]
#: how long wait() keeps trying while the server is unreachable (e.g. restarting)
UNREACHABLE_GRACE_S = 120.0


class Client:
    """A kassay API client. `base_url` defaults to $KASSAY_SERVER, `token` to $KASSAY_TOKEN.
    Idempotent calls (reads, cancel, and create with an idempotency key, which create always
    sends) are retried `max_retries` times with backoff on connection errors and 5xx."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        http_client: httpx.Client | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = resolve_base_url(base_url)
        self.max_retries = max_retries
        self.timeout = timeout
        self._http = http_client or httpx.Client(
            base_url=self.base_url, timeout=timeout, transport=transport
        )
        self._http.headers.update(default_headers(token))
        self.jobs = Jobs(self)
        self.artifacts = Artifacts(self)
        self.workers = Workers(self)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        idempotent: bool = True,
        params: Any = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """Send a request, retrying idempotent ones; raise the SDK error for 4xx/5xx."""
        attempt = 0
        while True:
            try:
                response = self._http.request(
                    method, path, params=params, content=content, headers=dict(headers or {})
                )
            except httpx.TimeoutException as exc:
                if idempotent and attempt < self.max_retries:
                    time.sleep(backoff(attempt))
                    attempt += 1
                    continue
                raise APITimeoutError(request=request_of(exc)) from exc
            except httpx.TransportError as exc:
                if idempotent and attempt < self.max_retries:
                    time.sleep(backoff(attempt))
                    attempt += 1
                    continue
                raise APIConnectionError(
                    f"could not reach {self.base_url}: {exc}", request=request_of(exc)
                ) from exc
            if response.status_code < 400:
                return response
            if idempotent and response.status_code in RETRY_STATUSES and attempt < self.max_retries:
                time.sleep(backoff(attempt, response))
                attempt += 1
                continue
            raise status_error(response)

    def series(
        self,
        key: str,
        *,
        labels: Mapping[str, str] | Iterable[str] | None = None,
        metric: str = "device_median_ms",
        output: str | None = None,
        limit: int = 100,
    ) -> Series:
        """A case key's metric (device_median_ms | rel_l2 | peak_bytes) over the last `limit`
        finished jobs with `labels`, oldest first, each with its job's labels."""
        r = self.request(
            "GET", "/v1/series", params=series_params(key, labels, metric, output, limit)
        )
        return Series.model_validate_json(r.content)

    def health(self) -> bool:
        """True when /healthz answers 200."""
        return self.request("GET", "/healthz").status_code == 200

    def ready(self) -> dict[str, Any]:
        """The /readyz body (raises InternalServerError-like 503 while not ready)."""
        data: dict[str, Any] = self.request("GET", "/readyz", idempotent=False).json()
        return data


class Jobs:
    """client.jobs: create, get, list, wait, events, report, cancel."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def create(
        self,
        spec: SpecInput,
        *,
        idempotency_key: str | None = None,
        labels: Mapping[str, str] | None = None,
        artifacts: Sequence[str] | None = None,
    ) -> Job:
        """Submit a job. `spec` is a dict, YAML/JSON text, or a Path to a spec file; `labels`
        are merged into the spec's. The same `idempotency_key` returns the same job; without
        one, a fresh key still makes the call's own retries safe."""
        body, ctype = encode_spec(spec, labels, artifacts)
        key = idempotency_key or new_idempotency_key()
        r = self._c.request(
            "POST",
            "/v1/jobs",
            content=body,
            headers={"Content-Type": ctype, "Idempotency-Key": key},
        )
        return Job.model_validate_json(r.content)

    def get(self, job_id: str) -> Job:
        return Job.model_validate_json(self._c.request("GET", f"/v1/jobs/{job_id}").content)

    def list(
        self,
        *,
        state: str | None = None,
        labels: Mapping[str, str] | Iterable[str] | None = None,
        name: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> JobPage:
        """One page of jobs, newest first; pass `next_cursor` back as `cursor`."""
        r = self._c.request(
            "GET", "/v1/jobs", params=list_params(state, labels, name, limit, cursor)
        )
        return JobPage.model_validate_json(r.content)

    def iter(
        self,
        *,
        state: str | None = None,
        labels: Mapping[str, str] | Iterable[str] | None = None,
        name: str | None = None,
        page_size: int = 100,
    ) -> Iterator[Job]:
        """Every matching job, newest first, page by page."""
        cursor: str | None = None
        while True:
            page = self.list(state=state, labels=labels, name=name, limit=page_size, cursor=cursor)
            yield from page.items
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    @overload
    def report(self, job_id: str, *, format: Literal["json"] = "json") -> Report: ...
    @overload
    def report(self, job_id: str, *, format: Literal["junit", "markdown", "html"]) -> str: ...

    def report(self, job_id: str, *, format: str = "json") -> Report | str:
        """The report: a Report model for json, the text for junit, markdown and html."""
        if format not in REPORT_MEDIA:
            raise ValueError(f"format must be one of {', '.join(REPORT_MEDIA)}")
        r = self._c.request(
            "GET",
            f"/v1/jobs/{job_id}/report",
            params={"format": format},
            headers={"Accept": REPORT_MEDIA[format]},
        )
        return Report.model_validate_json(r.content) if format == "json" else r.text

    @overload
    def compare(
        self,
        job_id: str,
        *,
        to: str | None = None,
        to_labels: Mapping[str, str] | Iterable[str] | None = None,
        threshold: float | None = None,
        format: Literal["json"] = "json",
    ) -> Comparison: ...
    @overload
    def compare(
        self,
        job_id: str,
        *,
        to: str | None = None,
        to_labels: Mapping[str, str] | Iterable[str] | None = None,
        threshold: float | None = None,
        format: Literal["markdown"],
    ) -> str: ...

    def compare(
        self,
        job_id: str,
        *,
        to: str | None = None,
        to_labels: Mapping[str, str] | Iterable[str] | None = None,
        threshold: float | None = None,
        format: str = "json",
    ) -> Comparison | str:
        """The job against `to` (a job id) or the latest finished job with its name,
        `to_labels` (e.g. {"branch": "main"}) and device kind; with neither, the verdict its
        spec's compare_to asks for. `threshold`: a fraction (0.03: 3%) for suites that set none.
        NotFoundError when no job matches, ConflictError when the jobs ran on different kinds
        of device."""
        r = self._c.request(
            "GET",
            f"/v1/jobs/{job_id}/compare",
            params=compare_params(to, to_labels, threshold, format),
        )
        return Comparison.model_validate_json(r.content) if format == "json" else r.text

    def cancel(self, job_id: str) -> Job:
        r = self._c.request("POST", f"/v1/jobs/{job_id}/cancel")
        return Job.model_validate_json(r.content)

    def events(
        self, job_id: str, *, after: int = 0, read_timeout: float = 30.0
    ) -> Iterator[JobEvent]:
        """The job's server-sent events from `after` on: `result` events, then `final`."""
        headers = {"Accept": "text/event-stream"}
        if after:
            headers["Last-Event-ID"] = str(after)
        timeout = httpx.Timeout(self._c.timeout, read=read_timeout)
        try:
            with self._c._http.stream(
                "GET", f"/v1/jobs/{job_id}/events", headers=headers, timeout=timeout
            ) as r:
                if r.status_code >= 400:
                    r.read()
                    raise status_error(r)
                parser = SSEParser()
                for line in r.iter_lines():
                    msg = parser.feed(line)
                    if msg is None:
                        continue
                    event = to_event(*msg)
                    if event is not None:
                        yield event
                        if event.event == "final":
                            return
        except httpx.TimeoutException as exc:
            raise APITimeoutError(request=request_of(exc)) from exc
        except httpx.TransportError as exc:
            raise APIConnectionError(f"event stream of {job_id} broke: {exc}") from exc

    def wait(
        self,
        job_id: str,
        *,
        timeout: float | None = None,
        on_event: EventCallback | None = None,
        poll_interval: float = 1.0,
    ) -> Job:
        """Block until the job is over and return it. Follows the SSE stream (calling
        `on_event` for each result), reconnecting where it left off; falls back to polling
        (calling `on_event` with `progress` events) when the stream is not available.
        Raises WaitTimeoutError after `timeout` seconds (the job keeps running)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last = 0
        for _ in range(3):
            remaining = _remaining(deadline)
            try:
                for event in self.events(
                    job_id, after=last, read_timeout=min(30.0, remaining or 30.0) + 0.5
                ):
                    if event.id is not None and event.event == "result":
                        last = event.id
                    if on_event is not None:
                        on_event(event)
                    if event.event == "final" and event.job is not None:
                        return event.job
                    _check_deadline(deadline, job_id)
            except (APITimeoutError, APIConnectionError):
                _check_deadline(deadline, job_id)
        return self._poll(job_id, deadline, on_event, poll_interval)

    def _poll(
        self,
        job_id: str,
        deadline: float | None,
        on_event: EventCallback | None,
        poll_interval: float,
    ) -> Job:
        unreachable_since: float | None = None
        job: Job | None = None
        while True:
            try:
                job = self.get(job_id)
                unreachable_since = None
            except APIConnectionError:
                now = time.monotonic()
                unreachable_since = unreachable_since or now
                if now - unreachable_since > UNREACHABLE_GRACE_S:
                    raise
            if job is not None:
                if on_event is not None:
                    on_event(JobEvent(event="progress", job=job))
                if job.is_over:
                    return job
            _check_deadline(deadline, job_id, job)
            remaining = _remaining(deadline)
            time.sleep(poll_interval if remaining is None else min(poll_interval, remaining))


class Artifacts:
    """client.artifacts: upload the code a job brings (a wheel or a .py module), read what is
    stored. Uploading needs a token with the code scope."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def upload(self, path: str | Path) -> Artifact:
        """Store the wheel or module at `path`; the same bytes twice are stored once. Name the
        returned `digest` in a job's `artifacts` (or pass it to jobs.create(artifacts=...))."""
        params, data = artifact_upload(path)
        r = self._c.request(
            "POST",
            "/v1/artifacts",
            params=params,
            content=data,
            headers={"Content-Type": "application/octet-stream"},
        )
        return Artifact.model_validate_json(r.content)

    def get(self, digest: str) -> Artifact:
        r = self._c.request("GET", f"/v1/artifacts/{digest}")
        return Artifact.model_validate_json(r.content)

    def list(self, *, limit: int = 100) -> list[Artifact]:
        r = self._c.request("GET", "/v1/artifacts", params={"limit": limit})
        return [Artifact.model_validate(a) for a in r.json()]


class Workers:
    """client.workers: the workers the API dispatches to."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def list(self) -> list[Worker]:
        return [Worker.model_validate(w) for w in self._c.request("GET", "/v1/workers").json()]


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _check_deadline(deadline: float | None, job_id: str, job: Job | None = None) -> None:
    if deadline is not None and time.monotonic() >= deadline:
        raise WaitTimeoutError(f"job {job_id} is not over yet", job=job)
