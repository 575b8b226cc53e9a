"""A comparison rendered for people: the Markdown section (alone, or under a job's report) and
what JUnit gets (a regression is a failed testcase with the numbers in its message)."""

from __future__ import annotations

from kassay.contract.comparison import CaseComparison, Comparison
from kassay.reports.escaping import md as _md

MAX_ROWS = 50


def _case_label(e: CaseComparison) -> str:
    p = ",".join(f"{k}={v}" for k, v in e.params.items())
    return f"{p} [{e.regime} seed={e.seed}]"


def _speed(e: CaseComparison) -> str:
    s = e.speed
    if s is None:
        return "-"
    note = ", host-normalised" if s.host_normalised else ""
    return f"x{s.ratio:.3f} ({s.low:.3f}-{s.high:.3f}{note}) {s.verdict}"


def regressions_by_case(c: Comparison | None) -> dict[str, CaseComparison]:
    """case_id (in the compared job) -> its entry, for keys that regressed."""
    if c is None:
        return {}
    return {e.case_id: e for e in c.cases if e.regression and e.case_id}


def junit_message(e: CaseComparison) -> str:
    return "; ".join(e.reasons)


def to_markdown(c: Comparison, *, heading: str = "##", names: dict[str, str] | None = None) -> str:
    """The comparison as Markdown; `names`: case_id -> short name (kassay.contract.names) of
    this job's cases, used where one is known instead of the full params."""
    s = c.summary
    icon = "❌" if c.regression else "✅"
    target = f"{_md(c.to_name)} {_md(c.to_job_id or '')}"
    if c.to_labels:
        target += " (" + ", ".join(f"{_md(k)}={_md(v)}" for k, v in sorted(c.to_labels.items()))
        target += ")"
    out = [
        f"{heading} {icon} compared with {target}",
        "",
        f"**{s.regressions} regression(s)** in {s.cases} case keys ({s.compared} in both jobs): "
        f"{s.newly_failing} newly failing, {s.fixed} fixed, {s.new} new, {s.missing} missing; "
        f"{s.slower} slower, {s.faster} faster"
        + (
            f", {s.not_comparable} speed not comparable on this worker (a busy CPU host)"
            if s.not_comparable
            else ""
        )
        + f"; {s.less_accurate} less accurate, "
        f"{s.more_accurate} more accurate; {s.more_memory} more memory, {s.less_memory} less. "
        f"Threshold +{c.threshold:.1%} (unless a suite sets its own), "
        f"{c.confidence:.0%} confidence; device: {_md(', '.join(c.device_kinds) or '-')}.",
    ]
    changed = [
        e
        for e in c.cases
        if e.regression
        or e.status_change != "same"
        or (e.speed is not None and e.speed.verdict != "same")
        or e.accuracy
        or (e.memory is not None and e.memory.verdict != "same")
    ]
    changed.sort(key=lambda e: (not e.regression, e.op, e.impl))
    if changed:
        out += [
            "",
            "| op.impl | case | dtype | status | speed (99% CI) | what changed |",
            "|---|---|---|---|---|---|",
        ]
        for e in changed[:MAX_ROWS]:
            status = (
                e.status_change
                if e.status_change in ("new", "missing")
                else f"{e.status_before} → {e.status_after}"
            )
            what = e.reasons or [
                f"{a.output} {a.metric} {a.before:.3g} → {a.after:.3g} ({a.change})"
                for a in e.accuracy
            ]
            if e.memory is not None and e.memory.verdict == "less":
                what = [*what, f"less memory: {e.memory.before_bytes} → {e.memory.after_bytes} B"]
            mark = "❌ " if e.regression else ""
            short = (names or {}).get(e.case_id or "")
            case = short.removeprefix(f"{e.op}.{e.impl}").strip() if short else _case_label(e)
            out.append(
                f"| {mark}{_md(e.op)}.{_md(e.impl)} | {_md(case or '-')} | {_md(e.dtype)} | "
                f"{_md(status)} | {_speed(e)} | {_md('; '.join(what), 400) or '-'} |"
            )
        if len(changed) > MAX_ROWS:
            out.append(f"| … | {len(changed) - MAX_ROWS} more | | | | |")
    return "\n".join(out) + "\n"
