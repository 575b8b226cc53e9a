"""The one summary of a report that `kassay run` and `kassay submit --wait` print, and the one
table of exit codes they return.

On a terminal: a table of the cases (problems first) with the counts as its caption. Elsewhere
(a CI log): every case that did not pass on a line of its own, the regressions, then one line
with the counts, the exit code and where the report is. Both commands hand their report here as
the SDK's model (kassay_client.models.Report: `kassay run` converts its in-process report
through its JSON), so the same report reads the same whichever way it was made.

Exit codes (what CI steps branch on):
    0  every case passed (unsupported and skipped cases do not count against it)
    1  some case failed its tolerance
    2  some case errored, crashed or timed out; the job was cancelled or refused; a wait ran
       out of time; or the server answered with an error
    3  the server could not be reached
    4  with --fail-on-regression: the comparison found a regression (slower, less accurate,
       more memory, newly failing) and nothing else went wrong
When several apply, the first in 3, 2, 1, 4 wins.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from kassay_client.models import STATUSES

if TYPE_CHECKING:
    from kassay_client.models import Report

EXIT_PASSED, EXIT_FAILED, EXIT_ERROR, EXIT_UNREACHABLE, EXIT_REGRESSION = 0, 1, 2, 3, 4


def exit_code_of(counts: Any, *, cancelled: bool = False) -> int:
    """The exit code of a job's or report's case counts (`failed`, `error`, `crashed`,
    `timeout`): 2 for errors, crashes, timeouts or a cancelled job, 1 for failures, else 0."""
    if cancelled or counts.error or counts.crashed or counts.timeout:
        return EXIT_ERROR
    if counts.failed:
        return EXIT_FAILED
    return EXIT_PASSED


def checks_line(s: Any) -> str:
    """Counts of the verdict flags and of the points coverage added (empty when all are 0)."""
    parts = [
        f"{n} {what}"
        for n, what in (
            (getattr(s, "baseline_suspect", 0), "baseline suspect"),
            (getattr(s, "baseline_explained", 0), "baseline explained by its precision"),
            (getattr(s, "nondeterministic", 0), "nondeterministic"),
            (getattr(s, "biased", 0), "biased"),
            (getattr(s, "added_by_coverage", 0), "added by coverage"),
        )
        if n
    ]
    return ", ".join(parts)


def print_summary(report: Report, *, code: int, where: str) -> None:
    """The summary on stdout: the table on a terminal, the CI lines elsewhere. `where` is
    what the last CI line points to (the job's page, the report file)."""
    if not sys.stdout.isatty():  # a CI log: failures first, one line each, then the counts
        for text in ci_log(report, job_url=where, exit_code=code):
            print(text)
        return
    from rich.console import Console

    Console().print(summary_table(report))


def ci_log(report: Report, *, job_url: str, exit_code: int, max_lines: int = 60) -> list[str]:
    """The end of a CI log, as pytest writes one: every case that did not pass, one line each
    (its short name and what broke, by how much), then the regressions the same way, then one
    summary line with the job page's URL."""
    order = {"failed": 0, "error": 1, "crashed": 2, "timeout": 3}
    bad = sorted((c for c in report.cases if c.status in order), key=lambda c: order[c.status])
    out = []
    for c in bad[:max_lines]:
        since = f" (broken since {c.broken_since} on the compared branch)" if c.broken_since else ""
        out.append(f"{c.status.upper():8} {_name(c)}: {_broke(c)}{since}")
    if len(bad) > max_lines:
        out.append(f"... {len(bad) - max_lines} more not passing: see the report")
    names = {c.case_id: _name(c) for c in report.cases}
    comp = report.comparison
    regressed = [e for e in comp.cases if e.regression] if comp is not None else []
    for e in regressed[:max_lines]:
        who = names.get(e.case_id or "") or f"{e.op}.{e.impl} {e.case_id or e.to_case_id}"
        out.append(f"REGRESSION {who}: {'; '.join(e.reasons)[:300]}")
    if len(regressed) > max_lines:
        out.append(f"... {len(regressed) - max_lines} more regressions: see the report")
    s = report.summary
    parts = [f"{getattr(s, k, 0)} {k}" for k in STATUSES if getattr(s, k, 0)]
    if comp is not None:
        found = f"{len(regressed)} regression(s)" if regressed else "no regression"
        parts.append(f"{found} against {comp.to_name} {comp.to_job_id}")
        if comp.summary.not_comparable:
            parts.append(
                f"speed not comparable on this worker for {comp.summary.not_comparable} case(s)"
            )
    if s.cancelled:
        parts.append("cancelled")
    out.append(
        f"kassay: {', '.join(parts) or 'no cases'} · {s.total} cases · exit {exit_code} · {job_url}"
    )
    return out


def _is_convergence(c: Any) -> bool:
    return c.convergence is not None or c.regime.startswith("convergence")


def _convergence_label(c: Any) -> str:
    """A convergence case in one line: its regime and the verdict's numbers, not the model's
    shape fields its params carry."""
    v = c.convergence
    if v is None:  # not trained (error, unsupported): its message says why
        return f"[{c.regime}]"

    def f(x: Any) -> str:
        return "-" if x is None else format(float(x), "+.4f")

    seen = ", detectable" if v.get("detectable") else ""
    return (
        f"[{c.regime}] {v.get('steps')} steps x {len(v.get('seeds') or [])} seeds: Δ held-out "
        f"loss {f(v.get('mean_diff'))} nats, 90% CI [{f(v.get('ci_low'))}, "
        f"{f(v.get('ci_high'))}], margin ±{float(v.get('margin') or 0):.4f}{seen}"
    )


def _name(c: Any) -> str:
    if _is_convergence(c):
        return f"{c.op}.{c.impl} {_convergence_label(c)}"
    return c.name or f"{c.op}.{c.impl} " + ",".join(f"{k}={v}" for k, v in c.params.items())


def _broke(c: Any) -> str:
    """The limit a failed case broke and by how much, else its message's first reason."""
    if c.status == "failed":
        for o in c.outputs:
            if o.get("passed", True):
                continue
            for metric in ("max_abs", "rel_l2"):
                value, limit = o.get(metric), o.get(f"threshold_{metric}")
                if isinstance(value, float) and isinstance(limit, float) and value > limit:
                    return f"{o.get('name')} {metric} {value:.3g} > limit {limit:.3g}"
            return f"{o.get('name')}: {str(o.get('reason', '')).split('; ')[0]}"[:300]
    return c.message.split("\n")[0][:300]


def summary_table(report: Report, *, max_rows: int = 60) -> Any:
    """A rich table of the cases (problems first), with the summary as its caption."""
    from rich.markup import escape
    from rich.table import Table

    order = {k: i for i, k in enumerate(STATUSES)}
    cases = sorted(report.cases, key=lambda c: order.get(c.status, len(order)))
    s = report.summary
    caption = f"{s.total} cases: " + ", ".join(f"{getattr(s, k, 0)} {k}" for k in STATUSES)
    checks = checks_line(s)
    if checks:
        caption += f"; {checks}"
    table = Table(title=f"kassay · {report.name} · {report.state}", caption=caption)
    cols = ("op", "impl", "params", "regime", "dtype", "status", "worst rel_l2", "median ms")
    for col in (*cols, "message"):
        table.add_column(col, overflow="fold")
    style = {
        "passed": "green",
        "failed": "red",
        "error": "magenta",
        "crashed": "magenta",
        "timeout": "magenta",
    }
    varying = _varying_params(report)
    for c in cases[:max_rows]:
        rel = max((float(o.get("rel_l2", 0.0)) for o in c.outputs), default=None)
        ms = c.timing.get("median_ms") if c.timing else None
        keys = varying.get(c.op) or list(c.params)[:3]
        params = ",".join(f"{k}={c.params.get(k)}" for k in keys)
        if _is_convergence(c):
            params = _convergence_label(c)
        status = f"{c.status} [{', '.join(c.flags)}]" if c.flags else c.status
        table.add_row(
            c.op,
            c.impl,
            # escaped: "[convergence-…]" and "[normal seed=0]" are text, not rich markup
            escape(params),
            c.regime,
            c.dtype,
            f"[{style.get(c.status, 'dim')}]{escape(status)}[/]",
            "" if rel is None else f"{rel:.2e}",
            "" if ms is None else f"{ms:.3f}",
            escape(c.message[:120]),
        )
    if len(cases) > max_rows:
        table.add_row("…", f"{len(cases) - max_rows} more", *[""] * 7)
    return table


def _varying_params(report: Report) -> dict[str, list[str]]:
    """Per op, the params that differ between its cases (the grid axes): what tells rows
    apart."""
    seen: dict[str, dict[str, set[str]]] = {}
    for c in report.cases:
        per = seen.setdefault(c.op, {})
        for k, v in c.params.items():
            per.setdefault(k, set()).add(repr(v))
    return {op: [k for k, vals in per.items() if len(vals) > 1] for op, per in seen.items()}
