"""Markdown: a PR comment or CI step summary that leads with the verdict."""

from __future__ import annotations

from collections import defaultdict

from kassay.contract.results import BAD_STATUSES, CaseResult, Report
from kassay.reports import convergence
from kassay.reports.cases import (
    _regressions,
    artifacts_note,
    checks_line,
    fmt_device_ms,
    fmt_host_ms,
    headline,
    reference_cache_note,
    status_text,
    what_broke,
)
from kassay.reports.comparison_markdown import to_markdown as comparison_markdown
from kassay.reports.escaping import md as _md


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
    bad = [c for c in report.cases if c.status in BAD_STATUSES]
    if bad:
        out += ["", "### Not passing", "", "| case | status | what broke |", "|---|---|---|"]
        for c in bad[:50]:
            detail = what_broke(c) if c.status == "failed" else c.message
            if c.broken_since:
                detail += f" (broken since {c.broken_since} on the compared branch)"
            out.append(f"| {_md(c.display())} | {_md(status_text(c))} | {_md(detail)} |")
        if len(bad) > 50:
            out.append(f"| … {len(bad) - 50} more | | |")
    out += convergence.markdown(report, _md)
    if report.comparison is not None:
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
