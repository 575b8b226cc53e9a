"""What the sync and async clients share: request encoding, the retry policy, the SSE parser."""

from __future__ import annotations

import json
import os
import random
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from kassay_client import __version__
from kassay_client.models import CaseResult, Job, JobEvent

DEFAULT_TIMEOUT = 30.0
DEFAULT_MAX_RETRIES = 2
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
SpecInput = Mapping[str, Any] | str | Path


def resolve_base_url(base_url: str | None) -> str:
    url = base_url or os.environ.get("KASSAY_SERVER")
    if not url:
        raise ValueError("no server: pass base_url= or set KASSAY_SERVER")
    if "://" not in url:
        url = "http://" + url
    return url.rstrip("/")


def default_headers(token: str | None) -> dict[str, str]:
    headers = {"User-Agent": f"kassay-client/{__version__}", "Accept": "application/json"}
    token = token if token is not None else os.environ.get("KASSAY_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def encode_spec(
    spec: SpecInput,
    labels: Mapping[str, str] | None,
    artifacts: Sequence[str] | None = None,
) -> tuple[bytes, str]:
    """The request body and content type for a spec given as a dict, YAML/JSON text or a file
    path (Path). Extra labels are merged into the spec's own (they win); artifact digests are
    added to the spec's `artifacts`."""
    if isinstance(spec, Path):
        spec = spec.read_text()
    if isinstance(spec, str):
        if not labels and not artifacts:
            return spec.encode(), "application/yaml"
        import yaml

        data = yaml.safe_load(spec)
        if not isinstance(data, dict):  # let the server explain what is wrong with it
            return spec.encode(), "application/yaml"
        spec = data
    body = dict(spec)
    if labels:
        body["labels"] = {**dict(body.get("labels") or {}), **dict(labels)}
    if artifacts:
        body["artifacts"] = list(dict.fromkeys([*(body.get("artifacts") or []), *artifacts]))
    return json.dumps(body).encode(), "application/json"


def artifact_upload(path: str | Path) -> tuple[dict[str, str], bytes]:
    """The query and body of uploading the artifact at `path` (a wheel or a .py module)."""
    p = Path(path)
    return {"filename": p.name}, p.read_bytes()


def new_idempotency_key() -> str:
    return "kassay-client-" + uuid.uuid4().hex


def backoff(attempt: int, response: httpx.Response | None = None) -> float:
    """Seconds to wait before retry number `attempt` (0-based): Retry-After when the server
    sent one (capped), else 0.5 s doubling to 8 s with ±25 % jitter."""
    if response is not None:
        after = response.headers.get("retry-after")
        if after:
            try:
                return min(max(float(after), 0.0), 30.0)
            except ValueError:
                pass
    base: float = min(0.5 * (2**attempt), 8.0)
    return base * (0.75 + 0.5 * random.random())


@dataclass
class SSEParser:
    """Incremental text/event-stream parser (WHATWG rules, enough for kassay's events)."""

    event: str = ""
    data: list[str] = field(default_factory=list)
    last_id: str | None = None

    def feed(self, line: str) -> tuple[str, str, str | None] | None:
        """Feed one line (without its newline); returns (event, data, id) at a blank line."""
        if line == "":
            if not self.data and not self.event:
                return None
            out = (self.event or "message", "\n".join(self.data), self.last_id)
            self.event, self.data = "", []
            return out
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self.event = value
        elif name == "data":
            self.data.append(value)
        elif name == "id":
            self.last_id = value
        return None


def to_event(event: str, data: str, event_id: str | None) -> JobEvent | None:
    """A JobEvent from one SSE message (None for events kassay does not define)."""
    eid = int(event_id) if event_id and event_id.isdigit() else None
    if event == "result":
        return JobEvent(event=event, id=eid, result=CaseResult.model_validate_json(data))
    if event == "final":
        return JobEvent(event=event, id=eid, job=Job.model_validate_json(data))
    return None


def list_params(
    state: str | None,
    labels: Mapping[str, str] | Iterable[str] | None,
    name: str | None,
    limit: int,
    cursor: str | None,
) -> list[tuple[str, str]]:
    params: list[tuple[str, str]] = [("limit", str(limit))]
    if state:
        params.append(("state", state))
    if name:
        params.append(("name", name))
    if cursor:
        params.append(("cursor", cursor))
    return params + [("label", item) for item in _label_items(labels)]


#: the API's report formats (kassay.reports.FORMATS: the SDK reaches the API only over HTTP,
#: so it keeps this mirror; tests/unit/client/test_sdk_contract.py holds the two equal)
REPORT_MEDIA = {
    "json": "application/json",
    "junit": "application/xml",
    "markdown": "text/markdown",
    "html": "text/html",
}


def request_of(exc: httpx.RequestError) -> httpx.Request | None:
    """The request of an httpx error, when it has one (the property raises otherwise)."""
    try:
        return exc.request
    except RuntimeError:
        return None


def compare_params(
    to: str | None,
    to_labels: Mapping[str, str] | Iterable[str] | None,
    threshold: float | None,
    format: str,
) -> list[tuple[str, str]]:
    """Query of GET /v1/jobs/{id}/compare. `threshold` is a fraction (0.03: 3%)."""
    if format not in ("json", "markdown"):
        raise ValueError("format must be json or markdown")
    params: list[tuple[str, str]] = [("format", format)]
    if to:
        params.append(("to", to))
    params += [("to_labels", item) for item in _label_items(to_labels)]
    if threshold is not None:
        params.append(("threshold", repr(float(threshold))))
    return params


def series_params(
    key: str,
    labels: Mapping[str, str] | Iterable[str] | None,
    metric: str,
    output: str | None,
    limit: int,
) -> list[tuple[str, str]]:
    params: list[tuple[str, str]] = [("key", key), ("metric", metric), ("limit", str(limit))]
    if output:
        params.append(("output", output))
    return params + [("labels", item) for item in _label_items(labels)]


def _label_items(labels: Mapping[str, str] | Iterable[str] | None) -> list[str]:
    if isinstance(labels, Mapping):
        return [f"{k}={v}" for k, v in labels.items()]
    return list(labels or [])
