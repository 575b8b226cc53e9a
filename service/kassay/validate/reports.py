"""Render a Report as JSON (the versioned schema), JUnit XML, Markdown (fit for a CI step
summary) or a standalone HTML page."""

from __future__ import annotations

import html
import json
import xml.etree.ElementTree as ET
from collections import defaultdict

from kassay.validate.results import CaseResult, Report, Summary

FORMATS = ("json", "junit", "markdown", "html")
MEDIA_TYPES = {
    "json": "application/json",
    "junit": "application/xml",
    "markdown": "text/markdown",
    "html": "text/html",
}


def render(report: Report, fmt: str) -> str:
    if fmt == "json":
        return report.model_dump_json(indent=2)
    if fmt == "junit":
        return to_junit(report)
    if fmt == "markdown":
        return to_markdown(report)
    if fmt == "html":
        return to_html(report)
    raise ValueError(f"unknown report format {fmt!r}; known: {', '.join(FORMATS)}")


def report_schema() -> dict:
    return Report.model_json_schema()


def schema_json() -> str:
    return json.dumps(report_schema(), indent=2, sort_keys=True) + "\n"


def status_text(c: CaseResult) -> str:
    """The status with the case's verdict flags, e.g. `failed [baseline_suspect]`."""
    return f"{c.status} [{', '.join(c.flags)}]" if c.flags else c.status


def checks_line(s: Summary) -> str:
    """Counts of the verdict flags and of the points coverage added (empty when all are 0)."""
    parts = [
        f"{n} {what}"
        for n, what in (
            (s.baseline_suspect, "baseline suspect"),
            (s.nondeterministic, "nondeterministic"),
            (s.biased, "biased"),
            (s.added_by_coverage, "added by coverage"),
        )
        if n
    ]
    return ", ".join(parts)


def worst_output(c: CaseResult) -> str:
    """One line naming the output furthest beyond its tolerance (or the largest rel_l2)."""
    failing = [o for o in c.outputs if not o.passed] or c.outputs
    if not failing:
        return c.message
    o = max(failing, key=lambda o: o.rel_l2 if o.rel_l2 == o.rel_l2 else float("inf"))
    thr = f" (limit {o.threshold_rel_l2:.3g})" if o.threshold_rel_l2 is not None else ""
    return (
        f"{o.name}: rel_l2={o.rel_l2:.3g}{thr} max_abs={o.max_abs:.3g} "
        f"max_ulp={o.max_ulp:.0f} nan={o.nan} inf={o.inf}"
    )


def to_junit(report: Report) -> str:
    suites = ET.Element(
        "testsuites",
        name=report.name,
        tests=str(report.summary.total),
        failures=str(report.summary.failed),
        errors=str(report.summary.error + report.summary.crashed + report.summary.timeout),
    )
    by_op: dict[str, list[CaseResult]] = defaultdict(list)
    for c in report.cases:
        by_op[c.op].append(c)
    for op, cases in by_op.items():
        ts = ET.SubElement(
            suites,
            "testsuite",
            name=op,
            tests=str(len(cases)),
            failures=str(sum(c.status == "failed" for c in cases)),
            errors=str(sum(c.status in ("error", "crashed", "timeout") for c in cases)),
            skipped=str(sum(c.status in ("unsupported", "skipped") for c in cases)),
        )
        for c in cases:
            t = c.timing.median_ms / 1e3 if c.timing else c.duration_s
            tc = ET.SubElement(
                ts, "testcase", classname=f"{c.op}.{c.impl}", name=c.label(), time=f"{t:.6f}"
            )
            if c.flags or c.coverage:
                props = ET.SubElement(tc, "properties")
                for flag in c.flags:
                    ET.SubElement(props, "property", name=flag, value="true")
                if c.coverage:
                    ET.SubElement(props, "property", name="added_by_coverage", value=c.coverage)
            if c.status == "failed":
                kind = c.flags[0] if c.flags else "tolerance"
                f = ET.SubElement(tc, "failure", message=c.message[:500], type=kind)
                f.text = "\n".join(worst_output_lines(c))
            elif c.status in ("error", "crashed", "timeout"):
                e = ET.SubElement(tc, "error", message=c.message[:500], type=c.status)
                e.text = c.message
            elif c.status in ("unsupported", "skipped"):
                ET.SubElement(tc, "skipped", message=f"{c.status}: {c.message}"[:500])
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode")


def worst_output_lines(c: CaseResult) -> list[str]:
    lines = []
    for o in c.outputs:
        mark = "ok  " if o.passed else "FAIL"
        lines.append(
            f"{mark} {o.name} [{o.dtype}]: max_abs={o.max_abs:.3g} rel_l2={o.rel_l2:.3g}"
            f" max_ulp={o.max_ulp:.0f} nan={o.nan} inf={o.inf} {o.reason}"
        )
        for w in o.worst[:3] if not o.passed else []:
            lines.append(f"      at {w.index}: got {w.value:.6g}, want {w.reference:.6g}")
    return lines


def _fmt_ms(c: CaseResult) -> str:
    if not c.timing:
        return "-"
    unit = "" if c.timing.clock == "cuda_events" else " (cpu)"
    return f"{c.timing.median_ms:.3f}{unit}"


def to_markdown(report: Report) -> str:
    s = report.summary
    icon = "✅" if s.ok else "❌"
    out = [f"## {icon} kassay: {report.name}", ""]
    if report.labels:
        out.append(" ".join(f"`{k}={v}`" for k, v in sorted(report.labels.items())))
        out.append("")
    out.append(
        f"**{s.total} cases**: {s.passed} passed, {s.failed} failed, {s.error} error, "
        f"{s.crashed} crashed, {s.timeout} timeout, {s.unsupported} unsupported, "
        f"{s.skipped} skipped"
    )
    if checks_line(s):
        out.append("")
        out.append(f"**Checks**: {checks_line(s)}")
    out.append("")
    out += [
        "| op | impl | cases | passed | failed | error/crash/timeout | unsupported |",
        "|---|---|---|---|---|---|---|",
    ]
    agg: dict[tuple[str, str], list[CaseResult]] = defaultdict(list)
    for c in report.cases:
        agg[(c.op, c.impl)].append(c)
    for (op, impl), cs in sorted(agg.items()):
        out.append(
            f"| {op} | {impl} | {len(cs)} | {sum(c.status == 'passed' for c in cs)} | "
            f"{sum(c.status == 'failed' for c in cs)} | "
            f"{sum(c.status in ('error', 'crashed', 'timeout') for c in cs)} | "
            f"{sum(c.status in ('unsupported', 'skipped') for c in cs)} |"
        )
    bad = [c for c in report.cases if c.status in ("failed", "error", "crashed", "timeout")]
    if bad:
        out += [
            "",
            "### Not passing",
            "",
            "| op.impl | case | status | worst |",
            "|---|---|---|---|",
        ]
        for c in bad[:50]:
            detail = worst_output(c) if c.status == "failed" else c.message
            out.append(
                f"| {c.op}.{c.impl} | {c.label()} | {status_text(c)} | "
                f"{detail.replace('|', '/')[:200]} |"
            )
        if len(bad) > 50:
            out.append(f"| … | {len(bad) - 50} more | | |")
    timed = [c for c in report.cases if c.timing]
    if timed:
        out += [
            "",
            "### Timing",
            "",
            "| op.impl | case | dtype | median ms | TFLOP/s | GB/s | "
            "roofline | vs baseline | peak extra MiB |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for c in timed[:100]:
            t = c.timing
            assert t is not None
            mem = (
                f"{c.memory.peak_extra_bytes / 2**20:.1f}"
                if c.memory and c.memory.peak_extra_bytes is not None
                else "-"
            )
            out.append(
                f"| {c.op}.{c.impl} | {c.label()} | {c.dtype} | {_fmt_ms(c)} | "
                f"{t.tflops or 0:.3g} | {t.gbps or 0:.3g} | "
                f"{(t.roofline_fraction or 0) * 100:.1f}% | "
                f"{f'{t.speedup_vs_baseline:.2f}x' if t.speedup_vs_baseline else '-'} | {mem} |"
            )
    if report.environments:
        e = report.environments[0]
        out += [
            "",
            f"<sub>{e.device_name} ({e.device}), torch {e.torch}, triton {e.triton}, "
            f"kassay {e.kassay}</sub>",
        ]
    return "\n".join(out) + "\n"


def _html_table(report: Report) -> str:
    rows = []
    for c in report.cases:
        color = {"passed": "#e6ffed", "failed": "#ffeef0"}.get(c.status, "#fff5b1")
        rows.append(
            f"<tr style='background:{color}'><td>{html.escape(c.op)}.{html.escape(c.impl)}</td>"
            f"<td>{html.escape(c.label())}</td><td>{html.escape(status_text(c))}</td>"
            f"<td>{html.escape(worst_output(c) if c.outputs else c.message)}</td>"
            f"<td>{_fmt_ms(c)}</td></tr>"
        )
    return (
        "<table><tr><th>op.impl</th><th>case</th><th>status</th><th>worst output</th>"
        "<th>median ms</th></tr>" + "".join(rows) + "</table>"
    )


def to_html(report: Report) -> str:
    s = report.summary
    title = html.escape(f"kassay: {report.name}")
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;font-size:13px}</style></head><body>"
        f"<h1>{title}</h1><p>{s.total} cases: {s.passed} passed, {s.failed} failed, "
        f"{s.error} error, {s.crashed} crashed, {s.timeout} timeout, "
        f"{s.unsupported} unsupported</p>"
        + (f"<p>Checks: {html.escape(checks_line(s))}</p>" if checks_line(s) else "")
        + f"{_html_table(report)}</body></html>"
    )
