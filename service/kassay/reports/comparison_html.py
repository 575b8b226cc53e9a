"""A Comparison as HTML: the dashboard's /compare page and the HTML report of a job whose spec
asks for one. Regressions first, then every other change; unchanged keys are counted only."""

from __future__ import annotations

from kassay.contract.comparison import CaseComparison, Comparison
from kassay.reports.escaping import e, num


def _params(c: CaseComparison) -> str:
    return ", ".join(f"{k}={v}" for k, v in c.params.items())


def _speed(c: CaseComparison) -> str:
    s = c.speed
    if s is None:
        return "-"
    return (
        f"{num(s.before_ms, '.4g')} → {num(s.after_ms, '.4g')} ms, ×{s.ratio:.3f} "
        f"({s.confidence:.0%} CI {s.low:.3f}–{s.high:.3f}"
        f"{', host-normalised' if s.host_normalised else ''}) <b class='{e(s.verdict)}'>"
        f"{e(s.verdict)}</b>"
    )


def _accuracy(c: CaseComparison) -> str:
    if not c.accuracy:
        return "-"
    return "<br>".join(
        f"{e(a.output)} {e(a.metric)} {num(a.before)} → {num(a.after)} "
        f"(noise limit {num(a.limit)}) <b class='{e(a.change)}'>{e(a.change)}</b>"
        for a in c.accuracy
    )


def _memory(c: CaseComparison) -> str:
    m = c.memory
    if m is None:
        return "-"
    return (
        f"{m.before_bytes / 2**20:.2f} → {m.after_bytes / 2**20:.2f} MiB "
        f"<b class='{e(m.verdict)}'>{e(m.verdict)}</b>"
    )


def _changed(c: CaseComparison) -> bool:
    return (
        c.regression
        or c.status_change != "same"
        or bool(c.accuracy)
        or (c.speed is not None and c.speed.verdict != "same")
        or (c.memory is not None and c.memory.verdict != "same")
    )


def comparison_html(cmp: Comparison) -> str:
    s = cmp.summary
    verdict = (
        "<p class='verdict bad'>regression</p>"
        if cmp.regression
        else "<p class='verdict ok'>no regression</p>"
    )
    head = (
        f"<p>job <a href='/jobs/{e(cmp.job_id)}'>{e(cmp.job_id)}</a> ({e(cmp.name)}) against "
        f"<a href='/jobs/{e(cmp.to_job_id)}'>{e(cmp.to_job_id)}</a> ({e(cmp.to_name)}) on "
        f"{e(', '.join(cmp.device_kinds) or '?')}; threshold {cmp.threshold:.1%}, "
        f"confidence {cmp.confidence:.0%}</p>"
    )
    counts = ", ".join(
        f"<span data-count='{k}'>{getattr(s, k)}</span> {k.replace('_', ' ')}"
        for k in (
            "cases",
            "compared",
            "regressions",
            "newly_failing",
            "fixed",
            "new",
            "missing",
            "slower",
            "faster",
            "less_accurate",
            "more_accurate",
            "more_memory",
            "less_memory",
        )
    )
    rows = []
    changed = sorted((c for c in cmp.cases if _changed(c)), key=lambda c: not c.regression)
    for c in changed:
        cls = "regression" if c.regression else ""
        status = (
            e(c.status_change)
            if c.status_change == "same"
            else f"{e(c.status_change)}: {e(c.status_before)} → {e(c.status_after)}"
        )
        reasons = "<br>".join(e(r) for r in c.reasons)
        rows.append(
            f"<tr class='{cls}' data-key='{e(c.key)}'><td>{e(c.op)}.{e(c.impl)}</td>"
            f"<td>{e(_params(c))} <span class='muted'>[{e(c.dtype)} {e(c.regime)}]</span>"
            f"<br><a class='muted' href='/history?key={e(c.key)}'>{e(c.key)}</a></td>"
            f"<td>{status}</td><td>{_speed(c)}</td><td>{_accuracy(c)}</td><td>{_memory(c)}</td>"
            f"<td>{reasons}</td></tr>"
        )
    table = (
        "<table class='comparison'><tr><th>op.impl</th><th>case</th><th>status</th>"
        "<th>speed</th><th>accuracy</th><th>memory</th><th>regression</th></tr>"
        + "".join(rows)
        + "</table>"
        if rows
        else "<p class='muted'>no case changed beyond the noise</p>"
    )
    return f"<div class='comparison'>{verdict}{head}<p>{counts}</p>{table}</div>"
