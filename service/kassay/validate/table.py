"""The terminal summary table of a report (rich)."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from kassay.reports import convergence
from kassay.reports.cases import (
    checks_line,
    fmt_device_ms,
    fmt_host_ms,
    status_text,
    worst_output,
)
from kassay.validate.results import Report

_COLORS = {"passed": "green", "failed": "red", "unsupported": "dim", "skipped": "dim"}


def summary_table(report: Report, *, max_rows: int = 200) -> Table:
    s = report.summary
    t = Table(
        title=f"kassay: {report.name} — {s.passed}/{s.total} passed, {s.failed} failed, "
        f"{s.error + s.crashed + s.timeout} error/crash/timeout, "
        f"{s.unsupported} unsupported" + (f" — {checks_line(s)}" if checks_line(s) else "")
    )
    for col in (
        "op.impl",
        "case",
        "dtype",
        "status",
        "worst output / message",
        "device ms",
        "host ms",
        "TFLOP/s",
        "GB/s",
    ):
        t.add_column(col, overflow="fold")
    for c in report.cases[:max_rows]:
        color = _COLORS.get(c.status, "yellow")
        tm = c.timing
        ms = fmt_device_ms(c)
        t.add_row(
            f"{c.op}.{c.impl}",
            # escaped: "[normal seed=0]" is text, not rich markup
            escape(convergence.label(c) if convergence.is_convergence(c) else c.label()),
            c.dtype,
            f"[{color}]{status_text(c)}[/{color}]",
            escape(worst_output(c) if c.outputs else c.message),
            ms,
            fmt_host_ms(c),
            f"{tm.tflops:.3g}" if tm and tm.tflops is not None else "-",
            f"{tm.gbps:.3g}" if tm and tm.gbps is not None else "-",
        )
    return t
