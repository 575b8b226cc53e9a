"""Hostile and careless input against the real app (in-process, no workers): each case was a
server error, a stall or an unbounded response before it was fixed, and must now be a quick,
small 4xx that stores nothing."""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient

from kassay.api.app import create_app
from kassay.settings import Settings

PARAMS = {"T": 8, "Hh": 2, "D": 4, "dtype": "float32"}


def _spec(**suite: object) -> dict:
    return {
        "name": "h",
        "suites": [{"op": "lse_merge", "impls": ["torch"], "params": PARAMS, **suite}],
    }


@pytest.fixture
def client(tmp_path):
    settings = Settings(database_url=f"sqlite:///{tmp_path}/k.db", max_body_bytes=1_000_000)
    with TestClient(create_app(settings, dispatch=False)) as c:
        yield c


def _refused(r, needle: str = "") -> dict:
    assert r.status_code == 422, (r.status_code, r.text[:500])
    assert len(r.content) < 4_000, "an error message must not echo unbounded input"
    body = r.json()
    assert needle in body["message"], body["message"]
    return body


def _post_yaml(client, text: str):
    return client.post("/v1/jobs", content=text, headers={"content-type": "application/yaml"})


def test_yaml_aliases_cannot_expand_a_small_body(client):
    big = "x" * 100_000
    refs = "\n".join(f"  k{i}: *s" for i in range(1000))
    text = f"name: n\nlabels:\n  a: &s {big}\n{refs}\nsuites: [{{op: lse_merge, impls: [torch]}}]\n"
    assert len(text) < 120_000
    t0 = time.monotonic()
    _refused(_post_yaml(client, text), "refused")
    assert time.monotonic() - t0 < 5
    assert client.get("/v1/jobs").json()["items"] == []


def test_nested_aliases_in_params_are_refused_quickly(client):
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    text = (
        "name: n\nx:\n"
        + "\n".join("  " + lv for lv in levels)
        + "\nsuites: [{op: lse_merge, impls: [torch], params: {T: *a8, Hh: 2, D: 4}}]\n"
    )
    assert len(text) < 1_000
    t0 = time.monotonic()
    _refused(_post_yaml(client, text), "once aliases are expanded")
    assert time.monotonic() - t0 < 5
    assert client.get("/healthz").status_code == 200


def test_deep_nesting_is_422_not_500(client):
    deep_json = "[" * 100_000 + "]" * 100_000
    r = client.post("/v1/jobs", content=deep_json, headers={"content-type": "application/json"})
    _refused(r, "nested deeper")
    _refused(_post_yaml(client, "[" * 5_000 + "]" * 5_000), "nested deeper")
    nested: object = 1
    for _ in range(900):
        nested = {"a": nested}
    _refused(client.post("/v1/jobs", json=_spec(params={**PARAMS, "T": nested})), "nested deeper")


def test_a_lone_surrogate_is_refused(client):
    body = json.dumps(_spec()).replace('"name": "h"', '"name": "h", "labels": {"k": "\\ud800"}')
    r = client.post("/v1/jobs", content=body, headers={"content-type": "application/json"})
    _refused(r, "surrogate")


def test_labels_are_bounded(client):
    _refused(client.post("/v1/jobs", json={**_spec(), "labels": {f"k{i}": "v" for i in range(65)}}))
    _refused(client.post("/v1/jobs", json={**_spec(), "labels": {"k" * 201: "v"}}))
    _refused(client.post("/v1/jobs", json={**_spec(), "labels": {"k": "v" * 1001}}))
    _refused(client.post("/v1/jobs", json={**_spec(), "labels": {"a b": "v"}}))
    ok = client.post("/v1/jobs", json={**_spec(), "labels": {"branch": "v" * 1000}})
    assert ok.status_code == 201, ok.text


@pytest.mark.parametrize("bad", [True, "16", 16.0])
def test_op_params_are_strict_types(client, bad):
    _refused(client.post("/v1/jobs", json=_spec(params={**PARAMS, "T": bad})), "T")


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "n", "suites": [{"op": "lse_merge", "impls": ["torch"], '
        '"params": {"T": 8, "Hh": 2, "D": 4}, "tolerance": {"factor": Infinity}}]}',
        '{"name": "n", "suites": [{"op": "lse_merge", "impls": ["torch"], '
        '"params": {"T": 8, "Hh": 2, "D": 4}, "tolerance": {"factor": NaN}}]}',
    ],
)
def test_numbers_are_finite(client, text):
    r = client.post("/v1/jobs", content=text, headers={"content-type": "application/json"})
    _refused(r, "finite")
    _refused(_post_yaml(client, text.replace("Infinity", ".inf").replace("NaN", ".nan")), "finite")


def test_numbers_must_fit_the_wire(client):
    _refused(client.post("/v1/jobs", json=_spec(seeds=[2**63])), "seeds")
    _refused(client.post("/v1/jobs", json=_spec(seeds=[-1])), "seeds")
    _refused(client.post("/v1/jobs", json=_spec(params={**PARAMS, "T": 2**63})), "T")
    assert client.post("/v1/jobs", json=_spec(seeds=[2**63 - 1])).status_code == 201


def test_int64_query_values_are_422(client):
    job = client.post("/v1/jobs", json=_spec()).json()
    assert client.get("/v1/jobs", params={"cursor": "9" * 20}).status_code == 422
    assert client.get("/v1/jobs", params={"cursor": "٣"}).status_code == 422  # a non-ASCII digit
    url = f"/v1/jobs/{job['id']}/events"
    assert client.get(url, params={"after": 2**64}).status_code == 422
    assert client.get(url, headers={"Last-Event-ID": "9" * 30}).status_code == 422
    assert client.get(url, headers={"Last-Event-ID": "²".encode("latin-1")}).status_code == 422


def test_markdown_report_escapes_what_the_sender_wrote(client):
    spec = {**_spec(), "name": "x | <script>alert(1)</script> [a](http://e)"}
    spec["labels"] = {"branch": "`rm -rf` *b* | c"}
    job = client.post("/v1/jobs", json=spec).json()
    md = client.get(f"/v1/jobs/{job['id']}/report", params={"format": "markdown"}).text
    assert "<script>" not in md and "[a](" not in md
    assert "\\<script\\>" in md and "\\[a\\](" in md and "x \\| " in md
    assert "branch=\\`rm -rf\\` \\*b\\* \\| c" in md


def test_the_job_spec_schema_is_published(client):
    schema = client.get("/openapi.json").json()
    body = schema["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"] == {"$ref": "#/components/schemas/JobSpec"}
    spec = schema["components"]["schemas"]["JobSpec"]
    assert {"name", "suites"} <= set(spec["required"])
    assert "Suite" in schema["components"]["schemas"]
