"""Reports: JSON validates against the published schema, JUnit parses, Markdown summarises."""

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from kassay import reports
from kassay.contract.results import CaseResult, Report
from kassay.contract.spec import parse_spec
from kassay.validate.local import run_job

ROOT = Path(__file__).resolve().parents[3]
SPEC = """
name: rep
labels: {commit: abc123}
suites:
  - op: lse_merge
    impls: [torch, m_zeros, te_style]
    params: {T: 8, Hh: 2, D: 4, K: 2, dtype: float16, mode: [merge, step]}
    regimes: [normal]
    coverage: none
    timing: {enabled: false}
"""


@pytest.fixture(scope="module")
def report() -> Report:
    return run_job(parse_spec(SPEC), device="cpu", include_mutants=True, ceilings=False)


def test_summary_counts(report: Report) -> None:
    s = report.summary
    # torch passes both modes; m_zeros fails merge and is unsupported in step (merge only);
    # te_style is unsupported in merge and passes step
    assert (s.total, s.passed, s.failed, s.unsupported) == (6, 3, 1, 2)
    assert not s.ok


def test_json_validates_against_published_schema(report: Report) -> None:
    schema = json.loads((ROOT / "docs" / "report.schema.json").read_text())
    assert schema == reports.report_schema(), "docs/report.schema.json is stale"
    data = json.loads(reports.render(report, "json"))
    jsonschema.validate(data, schema)
    assert data["schema_version"] == "kassay.report/v1"
    assert Report.model_validate(data) == report


def test_junit_parses_and_names_cases(report: Report) -> None:
    root = ET.fromstring(reports.render(report, "junit"))
    cases = root.findall(".//testcase")
    assert len(cases) == report.summary.total
    classnames = {c.get("classname") for c in cases}
    assert {"lse_merge.torch", "lse_merge.m_zeros", "lse_merge.te_style"} <= classnames
    failures = root.findall(".//failure")
    assert failures and "all zeros" in (failures[0].get("message") or "")
    assert "rel_l2" in (failures[0].text or "")
    assert root.findall(".//skipped")
    assert all("mode=" in (c.get("name") or "") for c in cases)


def test_markdown_and_html(report: Report) -> None:
    md = reports.render(report, "markdown")
    assert md.startswith("## ❌ kassay: rep")
    assert "| lse_merge | m_zeros | 2 | 0 | 1 |" in md and "### Not passing" in md
    assert "commit=abc123" in md
    page = reports.render(report, "html")
    assert page.startswith("<!doctype html>") and "m_zeros" in page
    with pytest.raises(ValueError, match="known: json, junit"):
        reports.render(report, "pdf")


def _torch_case(**fields: Any) -> CaseResult:
    """The torch case of group g, seed 0, with `fields` (op, params, regime, dtype, status...)."""
    return CaseResult(case_id="g:torch", group_id="g", impl="torch", seed=0, **fields)


def test_flags_and_coverage_marks_reach_every_format() -> None:
    from kassay.contract.results import Summary

    cases = [
        _torch_case(
            op="lse_merge",
            params={"T": 8},
            regime="empty_rows",
            dtype="float32",
            status="failed",
            message="out: baseline suspect: ...",
            flags=["baseline_suspect"],
            coverage="regime empty_rows",
        )
    ]
    rep = Report(name="f", summary=Summary.of(cases), cases=cases)
    assert rep.summary.baseline_suspect == 1 and rep.summary.added_by_coverage == 1
    md = reports.render(rep, "markdown")
    # Markdown escapes the brackets of sender-visible text; they render as [baseline_suspect]
    assert "failed \\[baseline_suspect\\]" in md and "+coverage: regime empty_rows" in md
    assert "1 baseline suspect" in md
    assert "baseline_suspect" in reports.render(rep, "html")
    junit = ET.fromstring(reports.render(rep, "junit").split("\n", 1)[1])
    props = {p.get("name") for p in junit.iter("property")}
    assert props == {"baseline_suspect", "added_by_coverage"}
    assert next(junit.iter("failure")).get("type") == "baseline_suspect"
    assert "1 baseline suspect" in _terminal_caption(rep)


def test_an_explained_baseline_says_so_with_its_numbers_in_every_format() -> None:
    from kassay.contract.results import Summary

    note = (
        "grad_weight: baseline explained by its precision: rel_l2 0.0142 against the exact "
        "reference, 9.11e-05 against the reference with logits rounded to float16; the others "
        "are judged against both"
    )
    case = _torch_case(
        op="flce",
        params={"N": 16},
        regime="large_logits",
        dtype="float16",
        status="passed",
        message=note,
        flags=["baseline_explained"],
    )
    rep = Report(name="f", summary=Summary.of([case]), cases=[case])
    assert rep.summary.baseline_explained == 1 and rep.summary.ok
    data = json.loads(reports.render(rep, "json"))
    jsonschema.validate(data, json.loads((ROOT / "docs" / "report.schema.json").read_text()))
    assert data["cases"][0]["message"] == note
    md = reports.render(rep, "markdown")
    assert "1 baseline explained by its precision" in md and "### Notes on passing cases" in md
    assert "9.11e-05 against the reference with logits rounded to float16" in md
    page = reports.render(rep, "html")
    assert "baseline_explained" in page and "9.11e-05 against the reference" in page
    junit = ET.fromstring(reports.render(rep, "junit").split("\n", 1)[1])
    assert {p.get("name") for p in junit.iter("property")} == {"baseline_explained"}
    assert next(junit.iter("system-out")).text == note and not list(junit.iter("failure"))
    assert "1 baseline explained by its precision" in _terminal_caption(rep)


def _terminal_caption(rep: Report) -> str:
    """The caption of the table `kassay run` and `kassay submit --wait` print for `rep`."""
    from kassay_client.models import Report as ReportView
    from kassay_client.summary import summary_table

    return str(summary_table(ReportView.model_validate_json(reports.render(rep, "json"))).caption)
