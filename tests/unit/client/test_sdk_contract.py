"""The SDK's response models (kassay_client.models) against what the API publishes: the OpenAPI
document of the app for the REST bodies, the report's JSON Schema for reports and case results
(also the SSE `result` events). The models are generated from those two schemas
(client/gen_models.py, `make sdk`), so that the SDK never imports the service; a generated file
that is not what the schemas give now fails here, and so does a field added, removed or
retyped on one side only. The checker below still proves that the generator's rules keep to
the leniency the SDK allows itself.

What the SDK may do differently, on purpose, to read any server of the same API:
- accept null where the server never sends it, and default a field the server always sends;
- read a nested object as a mapping: dict[str, Any], or dict[str, T] when each of the object's
  fields is a T (Job.links);
- read a string enum or constant as a plain string.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, TypeAdapter

from kassay.api.app import create_app
from kassay.reports import report_schema
from kassay.settings import Settings
from kassay_client import models

Schema = dict[str, Any]
ROOT = Path(__file__).resolve().parents[3]


@dataclass
class Doc:
    """A JSON Schema document: its named definitions resolve its $refs."""

    defs: dict[str, Schema]

    def resolve(self, s: Schema) -> Schema:
        while "$ref" in s:
            s = self.defs[s["$ref"].rsplit("/", 1)[-1]]
        return s

    def branches(self, s: Schema) -> list[Schema]:
        """The alternatives of a schema (anyOf flattened), resolved."""
        s = self.resolve(s)
        if "anyOf" in s:
            return [b for alt in s["anyOf"] for b in self.branches(alt)]
        return [s]


def _kind(s: Schema) -> str:
    if "properties" in s:
        return "model"
    t = s.get("type")
    if t is None:
        return "any"
    if t == "object":
        return "map"
    if t == "string":
        return "string" + (f"({s['format']})" if "format" in s else "")
    return str(t)


def _map_values(s: Schema) -> Schema:
    extra = s.get("additionalProperties", True)
    return extra if isinstance(extra, dict) else {}


@dataclass
class Contract:
    api: Doc
    sdk: Doc

    def type_problems(self, api_s: Schema, sdk_s: Schema, where: str) -> list[str]:
        """How a value the API sends under `api_s` may fail to parse as `sdk_s`, or differs."""
        api_b, sdk_b = self.api.branches(api_s), self.sdk.branches(sdk_s)
        if any(_kind(b) == "any" for b in sdk_b):
            return []
        out = []
        if any(_kind(b) == "null" for b in api_b) and not any(_kind(b) == "null" for b in sdk_b):
            out.append(f"{where}: the API may send null, the SDK does not accept it")
        api_t = {_kind(b): b for b in api_b if _kind(b) != "null"}
        sdk_t = {_kind(b): b for b in sdk_b if _kind(b) != "null"}
        if set(api_t) == {"model"} and set(sdk_t) == {"map"}:
            value = _map_values(sdk_t["map"])
            for name, prop in self.api.resolve(api_t["model"])["properties"].items():
                out += self.type_problems(prop, value, f"{where}.{name}")
            return out
        if set(api_t) != set(sdk_t):
            return [*out, f"{where}: the API's type is {sorted(api_t)}, the SDK's {sorted(sdk_t)}"]
        for kind, a in api_t.items():
            c = sdk_t[kind]
            if kind == "model":
                out += self.model_problems(a, c, where)
            elif kind == "map":
                out += self.type_problems(_map_values(a), _map_values(c), f"{where}[*]")
            elif kind == "array":
                out += self.type_problems(a.get("items", {}), c.get("items", {}), f"{where}[]")
        return out

    def model_problems(self, api_m: Schema, sdk_m: Schema, where: str) -> list[str]:
        api_p, sdk_p = api_m["properties"], sdk_m["properties"]
        out = [
            f"{where}.{f}: in the API's schema, not in the SDK's model"
            for f in api_p.keys() - sdk_p.keys()
        ]
        out += [
            f"{where}.{f}: in the SDK's model, not in the API's schema"
            for f in sdk_p.keys() - api_p.keys()
        ]
        api_req, sdk_req = set(api_m.get("required", ())), set(sdk_m.get("required", ()))
        for f in sorted(api_p.keys() & sdk_p.keys()):
            out += self.type_problems(api_p[f], sdk_p[f], f"{where}.{f}")
            if f in sdk_req and f not in api_req and "default" not in api_p[f]:
                out.append(f"{where}.{f}: the SDK requires it, the API may leave it out")
        return out


def _sdk_doc(tp: Any) -> tuple[Doc, Schema]:
    schema = TypeAdapter(tp).json_schema(mode="validation")
    return Doc(schema.pop("$defs", {})), schema


@pytest.fixture(scope="module")
def openapi(tmp_path_factory: pytest.TempPathFactory) -> Schema:
    db = tmp_path_factory.mktemp("contract") / "k.db"
    return create_app(Settings(database_url=f"sqlite:///{db}"), dispatch=False).openapi()


def _json_body(openapi: Schema, method: str, path: str) -> Schema:
    responses = openapi["paths"][path][method]["responses"]
    # every success status (POST /v1/jobs: 201 created, 200 the same Idempotency-Key) has one
    # body schema
    bodies = [
        r["content"]["application/json"]["schema"]
        for code, r in responses.items()
        if code.startswith("2")
    ]
    assert bodies and all(b == bodies[0] for b in bodies), bodies
    return bodies[0]


#: (method, path) of each JSON body the SDK parses, and the SDK type it parses it as
ENDPOINTS: list[tuple[str, str, Any]] = [
    ("post", "/v1/jobs", models.Job),
    ("get", "/v1/jobs", models.JobPage),
    ("get", "/v1/jobs/{job_id}", models.Job),
    ("post", "/v1/jobs/{job_id}/cancel", models.Job),
    ("get", "/v1/workers", list[models.Worker]),
    ("post", "/v1/artifacts", models.Artifact),
    ("get", "/v1/artifacts", list[models.Artifact]),
    ("get", "/v1/artifacts/{digest}", models.Artifact),
    ("get", "/v1/jobs/{job_id}/compare", models.Comparison),
    ("get", "/v1/series", models.Series),
]


def _problems(api: Doc, api_s: Schema, sdk_type: Any, where: str) -> list[str]:
    sdk, sdk_s = _sdk_doc(sdk_type)
    return Contract(api, sdk).type_problems(api_s, sdk_s, where)


@pytest.mark.parametrize(
    ("method", "path", "sdk_type"), ENDPOINTS, ids=[p for _, p, _ in ENDPOINTS]
)
def test_rest_bodies_match_the_openapi_schema(openapi, method, path, sdk_type) -> None:
    api = Doc(openapi["components"]["schemas"])
    body = _json_body(openapi, method, path)
    assert _problems(api, body, sdk_type, f"{method.upper()} {path}") == []


def test_report_matches_the_published_report_schema() -> None:
    """GET /v1/jobs/{id}/report (JSON) and the SSE `result` events (one CaseResult each)."""
    schema = report_schema()
    api = Doc(schema.pop("$defs", {}))
    assert _problems(api, schema, models.Report, "Report") == []
    case = api.defs["CaseResult"]
    assert _problems(api, case, models.CaseResult, "CaseResult") == []


def test_every_sdk_model_is_checked() -> None:
    """A new response model in the SDK must be added to the checks above (or here, with why
    it has no counterpart in the API)."""
    checked = {"Artifact", "Job", "JobPage", "Progress", "Worker", "Report", "Summary"}
    checked |= {"CaseResult", "Comparison", "ComparisonSummary", "CaseComparison", "Series"}
    checked |= {"SeriesPoint"}
    sdk_only = {
        "JobEvent": "the SSE envelope: its `job` and `result` are checked as Job and Report"
    }
    declared = {
        name
        for name in models.__all__
        if isinstance(getattr(models, name), type) and issubclass(getattr(models, name), BaseModel)
    }
    assert declared == checked | set(sdk_only)


def test_the_models_are_what_the_generator_gives_now(capsys, monkeypatch) -> None:
    """`python client/gen_models.py --check`: a server model changed without `make sdk` fails."""
    spec = importlib.util.spec_from_file_location("gen_models", ROOT / "client" / "gen_models.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gen_models", gen)  # its dataclasses look their module up
    spec.loader.exec_module(gen)
    assert gen.main(["--check"]) == 0, capsys.readouterr().err


# ------------------------------------------------------------------- the checker itself


def _contract(api_props: Schema, sdk_props: Schema, api_req=(), sdk_req=()) -> list[str]:
    api = {"properties": api_props, "required": list(api_req)}
    sdk = {"properties": sdk_props, "required": list(sdk_req)}
    return Contract(Doc({}), Doc({})).model_problems(api, sdk, "M")


STR, INT, NULL = {"type": "string"}, {"type": "integer"}, {"type": "null"}


def test_the_checker_catches_added_removed_retyped_and_nullable_fields() -> None:
    assert _contract({"a": STR}, {"a": STR}, ["a"], ["a"]) == []
    assert _contract({"a": STR, "b": INT}, {"a": STR}) == [
        "M.b: in the API's schema, not in the SDK's model"
    ]
    assert _contract({"a": STR}, {"a": STR, "b": INT}) == [
        "M.b: in the SDK's model, not in the API's schema"
    ]
    assert _contract({"a": STR}, {"a": INT}) == [
        "M.a: the API's type is ['string'], the SDK's ['integer']"
    ]
    assert _contract({"a": {"anyOf": [STR, NULL]}}, {"a": STR}) == [
        "M.a: the API may send null, the SDK does not accept it"
    ]
    assert _contract({"a": STR}, {"a": STR}, [], ["a"]) == [
        "M.a: the SDK requires it, the API may leave it out"
    ]


def test_the_checker_allows_what_the_sdk_does_on_purpose() -> None:
    model = {"type": "object", "properties": {"x": STR, "y": STR}}
    mapping = {"type": "object", "additionalProperties": STR}
    assert _contract({"a": STR}, {"a": {"anyOf": [STR, NULL]}}, ["a"], []) == []  # lenient SDK
    assert _contract({"a": model}, {"a": mapping}) == []  # a fixed-key object read as a dict
    assert _contract({"a": model}, {"a": {"type": "object"}}) == []  # kept as the server sends it
    assert _contract({"a": {"enum": ["p", "q"], "type": "string"}}, {"a": STR}) == []
    mixed = {"type": "object", "properties": {"x": STR, "n": INT}}
    assert _contract({"a": mixed}, {"a": mapping}) == [
        "M.a.n: the API's type is ['integer'], the SDK's ['string']"
    ]


def test_the_sdk_knows_every_report_format_of_the_registry() -> None:
    """One registry of formats (kassay.reports.FORMATS) read by the routes and the CLI; the SDK,
    which reaches the API only over HTTP, mirrors it, and this holds the mirror true."""
    from kassay.reports import FORMATS
    from kassay_client._base import REPORT_MEDIA

    assert {name: f.media_type for name, f in FORMATS.items()} == REPORT_MEDIA


def test_the_sdks_statuses_are_the_servers() -> None:
    from kassay.contract.results import STATUSES

    assert sorted(models.STATUSES) == sorted(STATUSES)
    assert models.STATUSES[-1] == "passed"  # worst first: the summaries list problems first
    for model in (models.Progress, models.Summary):
        assert set(STATUSES) <= set(model.model_fields), model.__name__
