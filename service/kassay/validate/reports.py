"""Render a Report as JSON (the versioned schema), JUnit XML, Markdown (fit for a CI step
summary) or a standalone HTML page."""

from __future__ import annotations

import json
import re
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
            (s.baseline_explained, "baseline explained by its precision"),
            (s.nondeterministic, "nondeterministic"),
            (s.biased, "biased"),
            (s.added_by_coverage, "added by coverage"),
        )
        if n
    ]
    return ", ".join(parts)


def worst_output(c: CaseResult) -> str:
    """One line naming the output furthest beyond its tolerance (or the largest rel_l2), with
    the limit it broke (max_abs or rel_l2: whichever failed)."""
    from kassay.validate.html_report import failed_limits

    failing = [o for o in c.outputs if not o.passed] or c.outputs
    if not failing:
        return c.message
    o = max(failing, key=lambda o: o.rel_l2 if o.rel_l2 == o.rel_l2 else float("inf"))
    broke = f" (failed: {'; '.join(failed_limits(o))})" if not o.passed else ""
    return (
        f"{o.name}: rel_l2={o.rel_l2:.3g} max_abs={o.max_abs:.3g} "
        f"max_ulp={o.max_ulp:.0f} nan={o.nan} inf={o.inf}{broke}"
    )


def to_junit(report: Report) -> str:
    from kassay.validate.comparison_report import junit_message, regressions_by_case

    # With a comparison, a passing case that regressed fails with type "regression".
    passed = {c.case_id for c in report.cases if c.status == "passed"}
    regressed = {
        cid: e for cid, e in regressions_by_case(report.comparison).items() if cid in passed
    }
    cancelled = report.summary.cancelled
    suites = ET.Element(
        "testsuites",
        name=report.name,
        tests=str(report.summary.total + cancelled),
        failures=str(report.summary.failed + len(regressed)),
        errors=str(
            report.summary.error + report.summary.crashed + report.summary.timeout + cancelled
        ),
    )
    if cancelled:  # a CI step reading the JUnit must not pass a run that stopped short
        ts = ET.SubElement(suites, "testsuite", name="kassay", tests="1", failures="0", errors="1")
        tc = ET.SubElement(ts, "testcase", classname="kassay.job", name="job", time="0")
        left = report.summary.skipped
        ET.SubElement(
            tc, "error", message=f"job cancelled: {left} case(s) skipped", type="cancelled"
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
            failures=str(sum(c.status == "failed" or c.case_id in regressed for c in cases)),
            errors=str(sum(c.status in ("error", "crashed", "timeout") for c in cases)),
            skipped=str(sum(c.status in ("unsupported", "skipped") for c in cases)),
        )
        for c in cases:
            t = c.timing.median_ms / 1e3 if c.timing else c.duration_s
            tc = ET.SubElement(
                ts,
                "testcase",
                classname=f"{c.op}.{c.impl}",
                # the short name without op.impl (the classname has them)
                name=c.name.removeprefix(f"{c.op}.{c.impl}").strip() or c.label(),
                time=f"{t:.6f}",
            )
            if c.flags or c.coverage or c.ran_in != "trusted":
                props = ET.SubElement(tc, "properties")
                for flag in c.flags:
                    ET.SubElement(props, "property", name=flag, value="true")
                if c.coverage:
                    ET.SubElement(props, "property", name="added_by_coverage", value=c.coverage)
                if c.ran_in != "trusted":  # the job's own code: timing measured in its sandbox
                    ET.SubElement(props, "property", name="ran_in", value=c.ran_in)
            if c.status == "failed":
                kind = c.flags[0] if c.flags else "tolerance"
                f = ET.SubElement(tc, "failure", message=c.message[:500], type=kind)
                f.text = "\n".join(worst_output_lines(c))
            elif c.status in ("error", "crashed", "timeout"):
                e = ET.SubElement(tc, "error", message=c.message[:500], type=c.status)
                e.text = c.message
            elif c.status in ("unsupported", "skipped"):
                ET.SubElement(tc, "skipped", message=f"{c.status}: {c.message}"[:500])
            elif c.case_id in regressed:
                msg = junit_message(regressed[c.case_id])
                f = ET.SubElement(tc, "failure", message=msg[:500], type="regression")
                f.text = "\n".join(regressed[c.case_id].reasons)
            if c.status == "passed" and c.message:  # a note (e.g. a baseline explained)
                ET.SubElement(tc, "system-out").text = c.message
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


# What could make sender text act as Markdown/HTML in a table cell: code, emphasis, links,
# raw HTML, cell breaks, strikethrough. (Intraword "_" stays readable: GFM ignores it.)
_MD_SPECIAL = re.compile(r"([\\`*\[\]<>|~])")


def _md(text: str, limit: int = 200) -> str:
    """Text from a sender (names, labels, messages) as inert Markdown: one line, the
    characters of code, emphasis, links, HTML and cell breaks backslash-escaped, at most
    `limit` characters."""
    one_line = " ".join(str(text).split())
    if len(one_line) > limit:
        one_line = one_line[: limit - 1] + "…"
    return _MD_SPECIAL.sub(r"\\\1", one_line)


def fmt_device_ms(c: CaseResult) -> str:
    """Device time (the headline), labelled by how it was taken: `graph` (CUDA-graph replay),
    `events` (direct calls back to back), `cpu`; `warm` when the L2 was not flushed; `!` when
    the GPU throttled or sat at its power limit meanwhile."""
    t = c.timing
    if not t:
        return "-"
    tags: list[str] = [t.mode]
    if t.clock == "cuda_events" and not t.l2_flushed:
        tags.append("warm")
    if t.throttled or t.power_capped:
        tags.append("throttled" if t.throttled else "power-capped")
    return f"{t.median_ms:.3f} ({', '.join(tags)})"


def fmt_host_ms(c: CaseResult) -> str:
    t = c.timing
    if not t or t.host_overhead_ms is None or t.mode == "cpu":
        return "-"
    return f"{t.host_overhead_ms:.3f}"


def what_broke(c: CaseResult) -> str:
    """One phrase: the limit a failed case's first failing output broke and by how much
    (`grad_input max_abs 390 > limit 1.57e-05`), else the first reason of its message."""
    for o in c.outputs:
        if o.passed:
            continue
        for metric, limit in (
            ("max_abs", o.threshold_max_abs),
            ("rel_l2", o.threshold_rel_l2),
        ):
            value = getattr(o, metric)
            if limit is not None and value == value and value > limit:
                return f"{o.name} {metric} {value:.3g} > limit {limit:.3g}"
        return f"{o.name}: {o.reason.split('; ')[0]}"[:200]
    return c.message.split("; ")[0][:200]


def _regressions(report: Report) -> int:
    return report.comparison.summary.regressions if report.comparison is not None else 0


def headline(report: Report) -> str:
    """The verdict in a line: ok or not, what broke and how many regressions."""
    s = report.summary
    bad = s.failed + s.error + s.crashed + s.timeout
    parts = [f"{s.failed} failed"] if s.failed else []
    parts += [f"{n} {k}" for k, n in (("error", s.error), ("crashed", s.crashed)) if n]
    parts += [f"{s.timeout} timeout"] if s.timeout else []
    reg = _regressions(report)
    if reg:
        parts.append(f"{reg} regression(s)")
    if s.cancelled:
        parts.append("cancelled")
    if not parts:
        return f"all {s.passed} passed" + (" · no regression" if report.comparison else "")
    return " · ".join(parts) + f" of {s.total}" if bad or reg else " · ".join(parts)


def to_markdown(report: Report) -> str:
    """A PR comment / CI step summary that leads with the verdict: what failed and regressed,
    with numbers, then the details folded (`<details>`)."""
    s = report.summary
    icon = "✅" if s.ok and not _regressions(report) else "❌"
    out = [f"## {icon} kassay: {_md(report.name)} — {_md(headline(report))}", ""]
    if report.labels:
        out.append(" · ".join(f"{_md(k)}={_md(v)}" for k, v in sorted(report.labels.items())))
        out.append("")
    counts = (
        f"**{s.total} cases**: {s.passed} passed, {s.failed} failed, {s.error} error, "
        f"{s.crashed} crashed, {s.timeout} timeout, {s.unsupported} unsupported, "
        f"{s.skipped} skipped"
    )
    if report.comparison is not None:
        counts += f"; **{_regressions(report)} regression(s)**"
    out.append(counts)
    if checks_line(s):
        out.append("")
        out.append(f"**Checks**: {checks_line(s)}")
    bad = [c for c in report.cases if c.status in ("failed", "error", "crashed", "timeout")]
    if bad:
        out += ["", "### Not passing", "", "| case | status | what broke |", "|---|---|---|"]
        for c in bad[:50]:
            detail = what_broke(c) if c.status == "failed" else c.message
            if c.broken_since:
                detail += f" (broken since {c.broken_since} on the compared branch)"
            out.append(f"| {_md(c.display())} | {_md(status_text(c))} | {_md(detail)} |")
        if len(bad) > 50:
            out.append(f"| … {len(bad) - 50} more | | |")
    if report.comparison is not None:
        from kassay.validate.comparison_report import to_markdown as comparison_markdown

        names = {c.case_id: c.name for c in report.cases if c.name}
        out += [
            "",
            comparison_markdown(report.comparison, heading="###", names=names).rstrip("\n"),
        ]
    out += ["", "<details><summary>Per impl, notes and timing</summary>", ""]
    out += [
        "| op | impl | cases | passed | failed | error/crash/timeout | unsupported |",
        "|---|---|---|---|---|---|---|",
    ]
    agg: dict[tuple[str, str], list[CaseResult]] = defaultdict(list)
    for c in report.cases:
        agg[(c.op, c.impl)].append(c)
    for (op, impl), cs in sorted(agg.items()):
        out.append(
            f"| {_md(op)} | {_md(impl)} | {len(cs)} | {sum(c.status == 'passed' for c in cs)} | "
            f"{sum(c.status == 'failed' for c in cs)} | "
            f"{sum(c.status in ('error', 'crashed', 'timeout') for c in cs)} | "
            f"{sum(c.status in ('unsupported', 'skipped') for c in cs)} |"
        )
    noted = [c for c in report.cases if c.status == "passed" and c.message]
    if noted:
        out += ["", "#### Notes on passing cases", "", "| case | note |", "|---|---|"]
        for c in noted[:50]:
            out.append(f"| {_md(c.display())} | {_md(c.message, 400)} |")
        if len(noted) > 50:
            out.append(f"| … {len(noted) - 50} more | |")
    timed = [c for c in report.cases if c.timing]
    if timed:
        out += [
            "",
            "#### Timing",
            "",
            "| case | dtype | device ms | host overhead ms | TFLOP/s | GB/s | "
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
            where = " (sandbox)" if c.ran_in == "sandbox" else ""
            out.append(
                f"| {_md(c.display())}{where} | {c.dtype} | {fmt_device_ms(c)} | "
                f"{fmt_host_ms(c)} | "
                f"{t.tflops or 0:.3g} | {t.gbps or 0:.3g} | "
                f"{(t.roofline_fraction or 0) * 100:.1f}% | "
                f"{f'{t.speedup_vs_baseline:.2f}x' if t.speedup_vs_baseline else '-'} | {mem} |"
            )
        if any(c.ran_in == "sandbox" for c in timed):
            out += [
                "",
                "(sandbox): code the job brought, timed and measured in the sandboxed process it "
                "ran in; judged, like every case, by the trusted executor.",
            ]
    out += ["", "</details>"]
    if report.environments:
        e = report.environments[0]
        out += [
            "",
            f"<sub>{_md(str(e.device_name))} ({_md(str(e.device))}), torch {_md(str(e.torch))}, "
            f"triton {_md(str(e.triton))}, kassay {_md(str(e.kassay))}{reference_cache_note(report)}"
            f"{artifacts_note(report)}</sub>",
        ]
    return "\n".join(out) + "\n"


def artifacts_note(report: Report) -> str:
    """ ", code brought by the job: sha256 ..." from the cases' environments (the artifacts
    they ran), empty for a job that brought none."""
    digests: dict[str, None] = {}
    for c in report.cases:
        found = (c.environment.model_extra or {}).get("artifacts") if c.environment else None
        for d in found if isinstance(found, list) else []:
            digests[str(d)] = None
    if not digests:
        return ""
    return ", code brought by the job: " + ", ".join(f"sha256 {_md(d[:16])}…" for d in digests)


def reference_cache_note(report: Report) -> str:
    """ ", float64 references reused for H of G input groups" from the cases' environments
    (empty when no case says)."""
    seen: dict[str, str] = {}
    for c in report.cases:
        mark = (c.environment.model_extra or {}).get("reference_cache") if c.environment else None
        if mark in ("hit", "miss"):
            seen[c.group_id] = mark
    if not seen:
        return ""
    hits = sum(1 for m in seen.values() if m == "hit")
    return f", float64 references reused for {hits} of {len(seen)} input groups"


def to_html(report: Report) -> str:
    """A standalone page with the job page's per-case content and plots; its style and scripts
    (Chart.js included) are inlined, so it opens with no network."""
    from kassay.static import CHART_JS, asset
    from kassay.validate.html_report import standalone

    return standalone(report, asset("kassay.css"), [asset(CHART_JS), asset("report.js")])
