"""The asynchronous client: the same calls as `Client`, awaited.

async with AsyncClient("http://127.0.0.1:8000") as client:
    job = await client.jobs.create({"name": "x", "suites": [...]})
    job = await client.jobs.wait(job.id)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
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
from kassay_client.client import UNREACHABLE_GRACE_S, _check_deadline, _remaining
from kassay_client.errors import APIConnectionError, APITimeoutError, status_error
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

AsyncEventCallback = Callable[[JobEvent], Awaitable[None] | None]


class AsyncClient:
    """The async kassay API client; see `Client` for the arguments and retry policy."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        http_client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = resolve_base_url(base_url)
        self.max_retries = max_retries
        self.timeout = timeout
        self._http = http_client or httpx.AsyncClient(
            base_url=self.base_url, timeout=timeout, transport=transport
        )
        self._http.headers.update(default_headers(token))
        self.jobs = AsyncJobs(self)
        self.artifacts = AsyncArtifacts(self)
        self.workers = AsyncWorkers(self)

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        idempotent: bool = True,
        params: Any = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        attempt = 0
        while True:
            try:
                response = await self._http.request(
                    method, path, params=params, content=content, headers=dict(headers or {})
                )
            except httpx.TimeoutException as exc:
                if idempotent and attempt < self.max_retries:
                    await asyncio.sleep(backoff(attempt))
                    attempt += 1
                    continue
                raise APITimeoutError(request=request_of(exc)) from exc
            except httpx.TransportError as exc:
                if idempotent and attempt < self.max_retries:
                    await asyncio.sleep(backoff(attempt))
                    attempt += 1
                    continue
                raise APIConnectionError(
                    f"could not reach {self.base_url}: {exc}", request=request_of(exc)
                ) from exc
            if response.status_code < 400:
                return response
            if idempotent and response.status_code in RETRY_STATUSES and attempt < self.max_retries:
                await asyncio.sleep(backoff(attempt, response))
                attempt += 1
                continue
            raise status_error(response)

    async def series(
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
        r = await self.request(
            "GET", "/v1/series", params=series_params(key, labels, metric, output, limit)
        )
        return Series.model_validate_json(r.content)

    async def health(self) -> bool:
        return (await self.request("GET", "/healthz")).status_code == 200


class AsyncJobs:
    """client.jobs of the async client."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(
        self,
        spec: SpecInput,
        *,
        idempotency_key: str | None = None,
        labels: Mapping[str, str] | None = None,
        artifacts: Sequence[str] | None = None,
    ) -> Job:
        body, ctype = encode_spec(spec, labels, artifacts)
        key = idempotency_key or new_idempotency_key()
        r = await self._c.request(
            "POST",
            "/v1/jobs",
            content=body,
            headers={"Content-Type": ctype, "Idempotency-Key": key},
        )
        return Job.model_validate_json(r.content)

    async def get(self, job_id: str) -> Job:
        r = await self._c.request("GET", f"/v1/jobs/{job_id}")
        return Job.model_validate_json(r.content)

    async def list(
        self,
        *,
        state: str | None = None,
        labels: Mapping[str, str] | Iterable[str] | None = None,
        name: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> JobPage:
        r = await self._c.request(
            "GET", "/v1/jobs", params=list_params(state, labels, name, limit, cursor)
        )
        return JobPage.model_validate_json(r.content)

    @overload
    async def report(self, job_id: str, *, format: Literal["json"] = "json") -> Report: ...
    @overload
    async def report(self, job_id: str, *, format: Literal["junit", "markdown", "html"]) -> str: ...

    async def report(self, job_id: str, *, format: str = "json") -> Report | str:
        if format not in REPORT_MEDIA:
            raise ValueError(f"format must be one of {', '.join(REPORT_MEDIA)}")
        r = await self._c.request(
            "GET",
            f"/v1/jobs/{job_id}/report",
            params={"format": format},
            headers={"Accept": REPORT_MEDIA[format]},
        )
        return Report.model_validate_json(r.content) if format == "json" else r.text

    @overload
    async def compare(
        self,
        job_id: str,
        *,
        to: str | None = None,
        to_labels: Mapping[str, str] | Iterable[str] | None = None,
        threshold: float | None = None,
        format: Literal["json"] = "json",
    ) -> Comparison: ...
    @overload
    async def compare(
        self,
        job_id: str,
        *,
        to: str | None = None,
        to_labels: Mapping[str, str] | Iterable[str] | None = None,
        threshold: float | None = None,
        format: Literal["markdown"],
    ) -> str: ...

    async def compare(
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
        r = await self._c.request(
            "GET",
            f"/v1/jobs/{job_id}/compare",
            params=compare_params(to, to_labels, threshold, format),
        )
        return Comparison.model_validate_json(r.content) if format == "json" else r.text

    async def cancel(self, job_id: str) -> Job:
        r = await self._c.request("POST", f"/v1/jobs/{job_id}/cancel")
        return Job.model_validate_json(r.content)

    async def events(
        self, job_id: str, *, after: int = 0, read_timeout: float = 30.0
    ) -> AsyncIterator[JobEvent]:
        headers = {"Accept": "text/event-stream"}
        if after:
            headers["Last-Event-ID"] = str(after)
        timeout = httpx.Timeout(self._c.timeout, read=read_timeout)
        try:
            async with self._c._http.stream(
                "GET", f"/v1/jobs/{job_id}/events", headers=headers, timeout=timeout
            ) as r:
                if r.status_code >= 400:
                    await r.aread()
                    raise status_error(r)
                parser = SSEParser()
                async for line in r.aiter_lines():
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

    async def wait(
        self,
        job_id: str,
        *,
        timeout: float | None = None,
        on_event: AsyncEventCallback | None = None,
        poll_interval: float = 1.0,
    ) -> Job:
        """See `Jobs.wait`; `on_event` may be a coroutine function."""

        async def emit(event: JobEvent) -> None:
            if on_event is not None:
                out = on_event(event)
                if out is not None:
                    await out

        deadline = None if timeout is None else time.monotonic() + timeout
        last = 0
        for _ in range(3):
            remaining = _remaining(deadline)
            try:
                async for event in self.events(
                    job_id, after=last, read_timeout=min(30.0, remaining or 30.0) + 0.5
                ):
                    if event.id is not None and event.event == "result":
                        last = event.id
                    await emit(event)
                    if event.event == "final" and event.job is not None:
                        return event.job
                    _check_deadline(deadline, job_id)
            except (APITimeoutError, APIConnectionError):
                _check_deadline(deadline, job_id)
        unreachable_since: float | None = None
        job: Job | None = None
        while True:
            try:
                job = await self.get(job_id)
                unreachable_since = None
            except APIConnectionError:
                now = time.monotonic()
                unreachable_since = unreachable_since or now
                if now - unreachable_since > UNREACHABLE_GRACE_S:
                    raise
            if job is not None:
                await emit(JobEvent(event="progress", job=job))
                if job.is_over:
                    return job
            _check_deadline(deadline, job_id, job)
            remaining = _remaining(deadline)
            await asyncio.sleep(
                poll_interval if remaining is None else min(poll_interval, remaining)
            )


class AsyncArtifacts:
    """client.artifacts: upload the code a job brings (a wheel or a .py module), read what is
    stored. Uploading needs a token with the code scope."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def upload(self, path: str | Path) -> Artifact:
        """Store the wheel or module at `path`; the same bytes twice are stored once. Name the
        returned `digest` in a job's `artifacts` (or pass it to jobs.create(artifacts=...))."""
        params, data = artifact_upload(path)
        r = await self._c.request(
            "POST",
            "/v1/artifacts",
            params=params,
            content=data,
            headers={"Content-Type": "application/octet-stream"},
        )
        return Artifact.model_validate_json(r.content)

    async def get(self, digest: str) -> Artifact:
        r = await self._c.request("GET", f"/v1/artifacts/{digest}")
        return Artifact.model_validate_json(r.content)

    async def list(self, *, limit: int = 100) -> list[Artifact]:
        r = await self._c.request("GET", "/v1/artifacts", params={"limit": limit})
        return [Artifact.model_validate(a) for a in r.json()]


class AsyncWorkers:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def list(self) -> list[Worker]:
        r = await self._c.request("GET", "/v1/workers")
        return [Worker.model_validate(w) for w in r.json()]
