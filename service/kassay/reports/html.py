"""The per-case view of a report as HTML, shared by the dashboard's job page and the downloadable
HTML report: one section per suite with a sortable table of its cases (only the parameters that
vary within the suite get a column), an expansion per case (each output's errors, the limit that
failed, the worst elements, timing, memory), and the data of three plots (error, speed, memory)
that static/report.js draws with Chart.js.

Everything a sender wrote (names, labels, params, messages) is escaped; the plot data travels as
JSON inside a <script type="application/json"> element with "<" escaped, so it cannot end the
element early.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from kassay.contract.results import (
    BAD_STATUSES,
    NOT_JUDGED,
    STATUSES,
    CaseResult,
    OutputMetrics,
    Report,
)
from kassay.reports import convergence
from kassay.reports.cases import failed_limits
from kassay.reports.comparison_html import comparison_html
from kassay.reports.escaping import _finite, e, json_for_script, num

#: table order: failures first, then what ran, then what did not
STATUS_RANK = {s: i for i, s in enumerate((*BAD_STATUSES, "passed", *NOT_JUDGED))}
#: the status counts a summary shows; they add up to the job's total with `pending`
COUNTED = STATUSES


# ------------------------------------------------------------------------------ the limits


def worst_error(c: CaseResult) -> OutputMetrics | None:
    """The output to show in a one-line summary: the first failing one, else the largest
    rel-L2."""
    failing = [o for o in c.outputs if not o.passed]
    if failing:
        return failing[0]
    if not c.outputs:
        return None
    return max(c.outputs, key=lambda o: o.rel_l2 if o.rel_l2 == o.rel_l2 else math.inf)


def case_summary(c: CaseResult) -> str:
    """One line: the failed limits of a failed case, the message of one that did not run, the
    worst output's errors of a passing one."""
    if c.status == "failed":
        lines = [f"{o.name}: {'; '.join(failed_limits(o))}" for o in c.outputs if not o.passed]
        return " · ".join(lines) or c.message
    o = worst_error(c)
    if o is None or c.status in BAD_STATUSES:
        return c.message
    return f"{o.name}: rel_l2={num(o.rel_l2)} max_abs={num(o.max_abs)}"


# ---------------------------------------------------------------------- suites and params


def suites_of(report: Report) -> list[list[CaseResult]]:
    by: dict[int, list[CaseResult]] = defaultdict(list)
    for c in report.cases:
        by[c.suite_index].append(c)
    return [by[k] for k in sorted(by)]


def _hashable(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def varying(cases: list[CaseResult]) -> tuple[list[str], dict[str, Any]]:
    """(the params that take more than one value within the cases, in the order the cases
    name them, with `dtype` and `regime` when they vary; the params that do not, with their
    one value). A param some cases lack varies."""
    names: dict[str, None] = {}
    for c in cases:
        names.update(dict.fromkeys(c.params))
    vary, fixed = [], {}
    for n in names:
        values = {_hashable(c.params.get(n, None)) if n in c.params else "\0" for c in cases}
        if len(values) > 1:
            vary.append(n)
        else:
            fixed[n] = cases[0].params.get(n)
    for extra in ("dtype", "regime", "seed"):
        if len({_hashable(getattr(c, extra)) for c in cases}) > 1:
            vary.append(extra)
        else:
            fixed[extra] = getattr(cases[0], extra)
    return vary, fixed


def value_of(c: CaseResult, name: str) -> Any:
    return getattr(c, name) if name in ("dtype", "regime", "seed") else c.params.get(name)


def _is_size(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def shape_params(cases: list[CaseResult], vary: list[str]) -> list[str]:
    """The varying params that are sizes (integers in every case): the speed plot's x axis."""
    return [n for n in vary if all(_is_size(value_of(c, n)) for c in cases)]


def x_param(cases: list[CaseResult], vary: list[str]) -> str | None:
    """The error plot's x axis: the varying param with the most distinct values."""
    if not vary:
        return None
    return max(vary, key=lambda n: len({_hashable(value_of(c, n)) for c in cases}))


# ------------------------------------------------------------------------------ plot data


def _speed_metric(cases: list[CaseResult]) -> str:
    """The op's natural unit (Op.speed_unit: flce TFLOP/s, lse_merge GB/s); for an op this
    build does not know, TFLOP/s when the cases sit nearer the matmul ceiling than the copy
    ceiling, else GB/s."""
    from kassay.errors import KassayError
    from kassay.ops import get_op

    try:
        return get_op(cases[0].op).speed_unit if cases else "tflops"
    except KassayError:
        pass
    f = b = 0.0
    for c in cases:
        t, env = c.timing, c.environment
        ceil = env.ceilings if env else {}
        if t and t.tflops and ceil.get("matmul_tflops"):
            f = max(f, t.tflops / ceil["matmul_tflops"])
        if t and t.gbps and ceil.get("copy_gbps"):
            b = max(b, t.gbps / ceil["copy_gbps"])
    if f == b == 0.0:
        return "tflops" if any(c.timing and c.timing.tflops for c in cases) else "gbps"
    return "tflops" if f >= b else "gbps"


def _max_rel_l2(c: CaseResult) -> float | None:
    errs = [o.rel_l2 for o in c.outputs if math.isfinite(o.rel_l2)]
    return max(errs) if errs else None


def plot_data(cases: list[CaseResult]) -> dict[str, Any]:
    """What report.js draws for one suite: one point per case (per plot where the case has the
    value), grouped by impl there."""
    vary, _ = varying(cases)
    shape = shape_params(cases, vary)
    x = x_param(cases, vary)
    points = []
    for c in cases:
        t, m = c.timing, c.memory
        points.append(
            {
                "case": c.case_id,
                "impl": c.impl,
                "status": c.status,
                "x": _hashable(value_of(c, x)).strip('"') if x else c.impl,
                "shape": " ".join(f"{n}={value_of(c, n)}" for n in shape) or "all",
                "label": ", ".join(f"{n}={value_of(c, n)}" for n in vary),
                "rel_l2": _max_rel_l2(c),
                "device_ms": _finite(t.median_ms) if t else None,
                "tflops": t.tflops if t else None,
                "gbps": t.gbps if t else None,
                "roofline": t.roofline_fraction if t else None,
                "peak_bytes": m.peak_extra_bytes if m else None,
                "model_bytes": m.model_bytes if m else None,
            }
        )
    return {
        "op": cases[0].op,
        "x_param": x or "impl",
        "speed_metric": _speed_metric(cases),
        "cpu": any(c.timing is not None and c.timing.mode == "cpu" for c in cases),
        "points": points,
    }


# ----------------------------------------------------------------------------- the tables


def _output_rows(c: CaseResult) -> str:
    rows = []
    for o in c.outputs:
        limits = failed_limits(o)
        verdict = (
            '<span class="ok">ok</span>'
            if o.passed
            else '<span class="bad">FAILED</span> ' + e("; ".join(limits))
        )
        rows.append(
            f"<tr><td>{e(o.name)}</td><td>{e(o.dtype)}</td><td>{e(o.shape)}</td>"
            f"<td>{num(o.max_abs)} / {num(o.threshold_max_abs)}</td>"
            f"<td>{num(o.rel_l2)} / {num(o.threshold_rel_l2)}</td><td>{num(o.max_ulp, '.0f')}</td>"
            f"<td>{o.nan}/{o.inf}</td><td>{o.n_bad}</td><td>{e(o.policy)}</td>"
            f"<td class='verdict'>{verdict}</td></tr>"
        )
    if not rows:
        return ""
    return (
        "<table class='inner'><tr><th>output</th><th>dtype</th><th>shape</th>"
        "<th>max-abs / limit</th><th>rel-L2 / limit</th><th>max ULP</th><th>NaN/Inf</th>"
        "<th>beyond tol</th><th>policy</th><th>verdict</th></tr>" + "".join(rows) + "</table>"
    )


def _why(c: CaseResult) -> str:
    parts = []
    for o in c.outputs:
        if o.passed:
            continue
        parts.append(
            f"<li><b>{e(o.name)}</b>: failed limit {e('; '.join(failed_limits(o)))}"
            + (f" <span class='muted'>({e(o.reason)})</span>" if o.reason else "")
            + "</li>"
        )
    return f"<ul class='why'>{''.join(parts)}</ul>" if parts else ""


def _worst(c: CaseResult) -> str:
    items = []
    for o in c.outputs:
        for w in o.worst[:5] if not o.passed else o.worst[:2]:
            items.append(
                f"<li>{e(o.name)}{e(w.index)}: got {num(w.value, '.6g')}, want "
                f"{num(w.reference, '.6g')} (|err| {num(w.abs_err)})</li>"
            )
    return f"<p><b>Worst elements</b></p><ul class='worst'>{''.join(items)}</ul>" if items else ""


def _timing(c: CaseResult) -> str:
    t = c.timing
    if t is None:
        return ""
    what = "CPU time" if t.mode == "cpu" else f"device time ({e(t.mode)}, {e(t.clock)})"
    extra = []
    if t.wall_median_ms is not None:
        extra.append(f"wall {num(t.wall_median_ms, '.4g')} ms")
    if t.host_overhead_ms is not None and t.mode != "cpu":
        extra.append(f"host overhead {num(t.host_overhead_ms, '.4g')} ms")
    if t.sm_clock_mhz:
        extra.append(f"SM clock {t.sm_clock_mhz:.0f} MHz")
    if t.power_w:
        extra.append(f"power {t.power_w:.0f} W")
    if t.throttle_reasons:
        extra.append("throttled: " + e(", ".join(t.throttle_reasons)))
    if t.l2_flushed:
        extra.append("L2 flushed")
    if t.calibration_ms:
        cal = statistics.median(t.calibration_ms)
        extra.append(
            f"<span title='{e(t.calibration or '')}'>host calibration {num(cal, '.4g')} ms</span>"
        )
    samples = ", ".join(num(s, ".4g") for s in t.samples_ms[:20])
    more = f" … ({len(t.samples_ms)} in all)" if len(t.samples_ms) > 20 else ""
    return (
        f"<p><b>Timing</b>: {what}: median {num(t.median_ms, '.4g')} ms, mean "
        f"{num(t.mean_ms, '.4g')}, std {num(t.std_ms, '.3g')}, p10 {num(t.p10_ms, '.4g')}, "
        f"p90 {num(t.p90_ms, '.4g')}, n={t.n}, rel. SEM {num(t.rel_sem, '.2%')}"
        + (f"; {'; '.join(extra)}" if extra else "")
        + f"<br><span class='muted'>samples (ms): {samples}{more}</span></p>"
    )


def _memory(c: CaseResult) -> str:
    m = c.memory
    if m is None:
        return ""
    peak = f"{m.peak_extra_bytes / 2**20:.2f} MiB" if m.peak_extra_bytes is not None else "-"
    ratio = f", {m.ratio_to_model:.2f}× the model" if m.ratio_to_model else ""
    note = f" <span class='muted'>{e(m.note)}</span>" if m.note else ""
    return (
        f"<p><b>Memory</b>: peak extra {peak} against {m.model_bytes / 2**20:.2f} MiB "
        f"unavoidable{ratio}{note}</p>"
    )


def case_detail(c: CaseResult) -> str:
    """The expansion of one case row."""
    head = f"<p><b>{e(c.op)}.{e(c.impl)}</b> <code>{e(c.case_id)}</code> · {e(c.label())}"
    if c.flags:
        head += f" · flags: {e(', '.join(c.flags))}"
    if c.ran_in == "sandbox":
        digests = (c.environment.model_extra or {}).get("artifacts") if c.environment else None
        code = f" (artifacts {e(', '.join(str(d)[:12] for d in digests))})" if digests else ""
        head += (
            f" · the job's own code{code}, run in its sandbox: timing and memory measured there, "
            "the verdict here"
        )
    head += "</p>"
    message = f"<p class='message'>{e(c.message)}</p>" if c.message else ""
    env = c.environment
    where = (
        f"<p class='muted'>ran on {e(env.device_name)} ({e(c.device or env.device)}) by "
        f"{e(c.worker or env.hostname)} in {c.duration_s:.2f} s</p>"
        if env
        else ""
    )
    return head + message + _why(c) + _output_rows(c) + _worst(c) + _timing(c) + _memory(c) + where


def _cell(text: str, sort: Any, cls: str = "") -> str:
    attr = f" class='{cls}'" if cls else ""
    return f"<td data-v='{e(sort)}'{attr}>{text}</td>"


def _fnum(v: float | None) -> float | str:
    return v if v is not None and math.isfinite(v) else ""


def suite_table(cases: list[CaseResult], vary: list[str]) -> str:
    heads = ["status", "impl", *vary, "rel-L2", "max-abs", "ms", "TFLOP/s", "GB/s", "roofline"]
    heads += ["peak MiB", "worst"]
    ordered = sorted(cases, key=lambda c: STATUS_RANK.get(c.status, 9))
    bodies = []
    for c in ordered:
        o = worst_error(c)
        t, m = c.timing, c.memory
        peak = m.peak_extra_bytes / 2**20 if m and m.peak_extra_bytes is not None else None
        cells = [
            _cell(e(c.status) + (" *" if c.flags else ""), STATUS_RANK.get(c.status, 9), c.status),
            _cell(e(c.impl), c.impl),
            *(_cell(e(value_of(c, n)), _sortable(value_of(c, n))) for n in vary),
            _cell(num(o.rel_l2) if o else "-", _fnum(o.rel_l2) if o else ""),
            _cell(num(o.max_abs) if o else "-", _fnum(o.max_abs) if o else ""),
            _cell(num(t.median_ms, ".4g") if t else "-", _fnum(t.median_ms) if t else ""),
            _cell(num(t.tflops) if t else "-", _fnum(t.tflops) if t else ""),
            _cell(num(t.gbps) if t else "-", _fnum(t.gbps) if t else ""),
            _cell(
                f"{t.roofline_fraction:.1%}" if t and t.roofline_fraction is not None else "-",
                _fnum(t.roofline_fraction) if t else "",
            ),
            _cell(num(peak), _fnum(peak)),
            _cell(e(case_summary(c)), "", "summary"),
        ]
        cov = f" data-coverage='{e(c.coverage)}'" if c.coverage else ""
        bodies.append(
            f"<tbody class='case' id='case-{e(c.case_id)}' data-status='{e(c.status)}'{cov}>"
            f"<tr class='row' tabindex='0' title='click to expand'>{''.join(cells)}</tr>"
            f"<tr class='detail' hidden><td colspan='{len(heads)}'>{case_detail(c)}</td></tr>"
            "</tbody>"
        )
    th = "".join(f"<th data-col='{i}'>{e(h)}</th>" for i, h in enumerate(heads))
    return f"<table class='cases sortable'><thead><tr>{th}</tr></thead>{''.join(bodies)}</table>"


def _sortable(v: Any) -> Any:
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def suite_sections(report: Report) -> str:
    """Each suite: its fixed params, its plots (canvases report.js fills) and its case table;
    then the convergence groups' verdicts and curves (reports.convergence)."""
    out = []
    for i, cases in enumerate(suites_of(report)):
        vary, fixed = varying(cases)
        impls = sorted({c.impl for c in cases})
        fixed_text = ", ".join(f"{k}={v}" for k, v in fixed.items())
        out.append(
            f"<section class='suite' data-suite='{i}'><h3>Suite {i + 1}: {e(cases[0].op)} "
            f"<span class='muted'>· {e(', '.join(impls))} · {len(cases)} cases</span></h3>"
            f"<p class='muted fixed'>same in every case: {e(fixed_text) or '-'}</p>"
            "<div class='plots'>"
            f"<figure><canvas data-plot='error' data-suite='{i}'></canvas></figure>"
            f"<figure><canvas data-plot='speed' data-suite='{i}'></canvas></figure>"
            # no empty chart: peak memory only where it was measured (CUDA)
            + (
                f"<figure><canvas data-plot='memory' data-suite='{i}'></canvas></figure>"
                if any(c.memory and c.memory.peak_extra_bytes is not None for c in cases)
                else ""
            )
            + "</div>"
            f"{suite_table(cases, vary)}</section>"
        )
    data = [plot_data(cases) for cases in suites_of(report)]
    return (
        "".join(out)
        + f"<script type='application/json' class='plot-data'>{json_for_script(data)}</script>"
        + convergence.html(report)
    )


def failures_list(report: Report) -> str:
    """Failures first: a list of the cases that did not pass, each linking to its row."""
    bad = [c for c in report.cases if c.status in BAD_STATUSES]
    if not bad:
        return ""
    items = "".join(
        f"<li><a href='#case-{e(c.case_id)}' class='jump'>{e(c.name or f'{c.op}.{c.impl}')}</a>"
        f" <span class='{e(c.status)}'>{e(c.status)}</span>"
        f"{'' if c.name else ' ' + e(c.label())}: {e(case_summary(c))}</li>"
        for c in bad[:100]
    )
    more = f"<li>… {len(bad) - 100} more</li>" if len(bad) > 100 else ""
    return f"<section class='failures'><h2>Not passing ({len(bad)})</h2><ul>{items}{more}</ul></section>"


def counts_line(counts: Mapping[str, int], total: int) -> str:
    """Status counts that add up to the total: every status, and the cases with no result yet
    (`pending`)."""
    parts = [
        f"<span class='count {k}' data-count='{k}'>{counts.get(k, 0)}</span> {k}" for k in COUNTED
    ]
    pending = total - sum(counts.get(k, 0) for k in COUNTED)
    parts.append(f"<span class='count' data-count='pending'>{pending}</span> pending")
    return f"<span data-count='total'>{total}</span> cases: " + ", ".join(parts)


def summary_counts(report: Report) -> dict[str, int]:
    return {k: getattr(report.summary, k) for k in COUNTED}


def environment_table(report: Report) -> str:
    rows = []
    for env in report.environments:
        clocks = ", ".join(f"{k}={v}" for k, v in env.clocks.items()) or "-"
        ceilings = ", ".join(f"{k}={v:.4g}" for k, v in env.ceilings.items()) or "-"
        rows.append(
            f"<tr><td>{e(env.device_name)}</td><td>{e(env.device)}</td><td>{e(env.driver or '-')}"
            f"</td><td>{e(env.cuda or '-')}</td><td>{e(env.torch)}</td><td>{e(env.triton or '-')}"
            f"</td><td>{e(env.kassay)}</td><td>{e(env.python)}</td><td>{e(env.hostname)}</td>"
            f"<td>{e(clocks)}</td><td>{e(ceilings)}</td></tr>"
        )
    if not rows:
        return "<p class='muted'>no environment reported yet</p>"
    return (
        "<table class='env'><tr><th>device</th><th>kind</th><th>driver</th><th>CUDA</th>"
        "<th>torch</th><th>triton</th><th>kassay</th><th>python</th><th>host</th>"
        "<th>clocks</th><th>ceilings</th></tr>" + "".join(rows) + "</table>"
    )


def regressions_list(report: Report) -> str:
    """The comparison's regressions, one line each by the case's short name, for the top of a
    page (the whole comparison is further down); empty without a comparison."""
    c = report.comparison
    if c is None:
        return ""
    names = {x.case_id: x.name for x in report.cases if x.name}
    found = [x for x in c.cases if x.regression]
    target = f"{e(c.to_name)} <a href='/jobs/{e(c.to_job_id or '')}'>{e(c.to_job_id or '')}</a>"
    if not found:
        return f"<p class='ok'>no regression against {target}</p>"
    items = "".join(
        f"<li><b>{e(names.get(x.case_id or '') or f'{x.op}.{x.impl}')}</b>: "
        f"{e('; '.join(x.reasons))}</li>"
        for x in found[:30]
    )
    more = f"<li>… {len(found) - 30} more (the comparison below)</li>" if len(found) > 30 else ""
    return (
        f"<h2 class='bad'>{len(found)} regression(s) against {target}</h2>"
        f"<ul class='regressions'>{items}{more}</ul>"
    )


def standalone(report: Report, css: str, scripts: list[str]) -> str:
    """The downloadable HTML report: the same sections as the job page with the style and the
    scripts inlined (no network)."""
    title = e(f"kassay: {report.name}")
    labels = " · ".join(f"{e(k)}={e(v)}" for k, v in sorted(report.labels.items()))
    inline = "".join(f"<script>{s}</script>" for s in scripts)
    comparison = ""
    if report.comparison is not None:
        comparison = "<h2>Comparison</h2>" + comparison_html(report.comparison)
    return (
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{title}</title>"
        f"<meta name='viewport' content='width=device-width'><style>{css}</style></head>"
        f"<body class='report'><h1>{title}</h1><p class='muted'>{labels}</p>"
        f"<p class='summary'>{e(report.state)} · {counts_line(summary_counts(report), report.summary.total)}</p>"
        f"{regressions_list(report)}{failures_list(report)}"
        f"<h2>Cases</h2>{suite_sections(report)}{comparison}"
        f"<h2>Environment</h2>{environment_table(report)}{inline}</body></html>"
    )


def to_html(report: Report) -> str:
    """A standalone page with the job page's per-case content and plots; its style and scripts
    (Chart.js included) are inlined, so it opens with no network."""
    from kassay.static import CHART_JS, asset

    return standalone(report, asset("kassay.css"), [asset(CHART_JS), asset("report.js")])
