"""What every report format says of a case: its status with flags, the limit it broke and by
how much, its worst output, its timing in a cell, the job's headline verdict."""

from __future__ import annotations

from kassay.contract.results import CaseResult, OutputMetrics, Report, Summary
from kassay.reports.escaping import md as _md
from kassay.reports.escaping import num


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


def failed_limits(o: OutputMetrics) -> list[str]:
    """The limits an output broke, each as "metric value > limit", from the recorded errors and
    thresholds (baseline policy); else the verdict's own reason (absolute policy, NaN/Inf, an
    unwritten output, a wrong dtype). Empty for a passing output."""
    if o.passed:
        return []
    out = []
    for metric, limit in (("max_abs", o.threshold_max_abs), ("rel_l2", o.threshold_rel_l2)):
        value = getattr(o, metric)
        if limit is not None and not (value <= limit):  # NaN counts as over
            out.append(f"{metric} {num(value)} > limit {num(limit)}")
    return out or [o.reason or "failed"]


def worst_output(c: CaseResult) -> str:
    """One line naming the output furthest beyond its tolerance (or the largest rel_l2), with
    the limit it broke (max_abs or rel_l2: whichever failed)."""
    failing = [o for o in c.outputs if not o.passed] or c.outputs
    if not failing:
        return c.message
    o = max(failing, key=lambda o: o.rel_l2 if o.rel_l2 == o.rel_l2 else float("inf"))
    broke = f" (failed: {'; '.join(failed_limits(o))})" if not o.passed else ""
    return (
        f"{o.name}: rel_l2={o.rel_l2:.3g} max_abs={o.max_abs:.3g} "
        f"max_ulp={o.max_ulp:.0f} nan={o.nan} inf={o.inf}{broke}"
    )


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
