"""Convergence cases in the reports (kassay.validate.convergence): a table of verdicts with the
matched held-out loss differences and their intervals, and, in HTML, the held-out loss curves
of the baseline, the control arm and each impl with their seed bands (inline SVG: it needs no
script, in the job page and the standalone report alike)."""

from __future__ import annotations

import math
from collections.abc import Callable
from html import escape as e

from kassay.contract.results import CaseResult, ConvergenceResult, Report
from kassay.contract.spec import CONVERGENCE_REGIME

WHAT_IT_SEES = (
    "A convergence check of this size sees gross bugs (a stale lse, wrong or missing "
    "gradients) and reports subtle ones as detectable against the control arm but not "
    "material; it cannot see what AdamW cancels (a small gradient scale) nor what only a long "
    "or large run would show."
)


def cases(report: Report) -> list[CaseResult]:
    return [c for c in report.cases if c.convergence is not None]


def _f(v: float | None, spec: str = "+.4f") -> str:
    return "-" if v is None else format(v, spec)


def _mean(xs: list[float | None]) -> float | None:
    ok = [x for x in xs if x is not None]
    return sum(ok) / len(ok) if ok and len(ok) == len(xs) else None


def row(c: CaseResult) -> tuple[str, str, str, str, str, str]:
    """(verdict, difference, 90% CI, margin, detectable, final loss) of a convergence case."""
    v = c.convergence
    assert v is not None
    # the runner's rule: a diverged run has no final loss (its diff is null), nor the mean
    diverged = any(d is None for d in v.diffs)
    final = None if diverged else _mean([curve[-1] if curve else None for curve in v.curves])
    return (
        v.verdict,
        _f(v.mean_diff),
        f"[{_f(v.ci_low)}, {_f(v.ci_high)}]",
        f"±{v.margin:.4f}",
        "yes" if v.detectable else "no",
        _f(final, ".4f"),
    )


def is_convergence(c: CaseResult) -> bool:
    """A case of a convergence group, trained or not (one in error carries no result)."""
    return c.convergence is not None or c.regime.startswith(CONVERGENCE_REGIME)


def label(c: CaseResult) -> str:
    """A convergence case in one line (the terminal's per-case lines and summary table): its
    regime and the verdict's numbers, not the model's shape fields its params carry."""
    v = c.convergence
    if v is None:  # not trained (error, unsupported): its message says why
        return f"[{c.regime}]"
    ci = f"90% CI [{_f(v.ci_low)}, {_f(v.ci_high)}]"
    seen = ", detectable" if v.detectable else ""
    return (
        f"[{c.regime}] {v.steps} steps x {len(v.seeds)} seeds: Δ held-out loss "
        f"{_f(v.mean_diff)} nats, {ci}, margin ±{v.margin:.4f}{seen}"
    )


def markdown(report: Report, md: Callable[[str], str]) -> list[str]:
    """The Markdown section, one table per convergence group (`md` escapes a table cell)."""
    conv = cases(report)
    if not conv:
        return []
    groups: dict[str, list[CaseResult]] = {}
    for c in conv:
        groups.setdefault(c.group_id, []).append(c)
    out = ["", "### Convergence"]
    for members in groups.values():
        v = members[0].convergence
        assert v is not None
        out += [
            "",
            f"**{md(members[0].op)}**: held-out loss after {v.steps} steps over "
            f"{len(v.seeds)} matched seeds against the baseline; control arm `{md(v.control)}`; "
            f"entropy floor {v.entropy_floor:.3f} nats, uniform guess {v.uniform_loss:.3f}.",
            "",
            "| case | verdict | Δ loss (nats) | 90% CI | margin | detectable | final loss |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in members:
            verdict, diff, ci, margin, det, final = row(c)
            out.append(
                f"| {md(c.display())} | {verdict} | {diff} | {ci} | {margin} | {det} | {final} |"
            )
    out += ["", WHAT_IT_SEES]
    return out


def _band(curves: list[list[float | None]]) -> list[tuple[float, float, float] | None]:
    """Per eval step: (min, mean, max) over seeds, None where a seed has no finite loss."""
    n = max((len(c) for c in curves), default=0)
    out: list[tuple[float, float, float] | None] = []
    for i in range(n):
        xs = [c[i] for c in curves if i < len(c)]
        if not xs or any(x is None or not math.isfinite(x) for x in xs):
            out.append(None)
            continue
        vals = [float(x) for x in xs if x is not None]
        out.append((min(vals), sum(vals) / len(vals), max(vals)))
    return out


_COLOURS = ("#444", "#888", "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf")


def svg(v: ConvergenceResult, arms: list[tuple[str, list[list[float | None]]]]) -> str:
    """Held-out loss curves (mean, and the min-max band over seeds) of each arm."""
    w, h, pad = 560, 260, 40
    steps = v.eval_steps
    vals = [
        x for _, curves in arms for c in curves for x in c if x is not None and math.isfinite(x)
    ]
    if not steps or not vals:
        return ""
    lo, hi = min([*vals, v.entropy_floor]), max(vals)
    hi = hi if hi > lo else lo + 1.0
    x_max = max(steps[-1], 1)

    def xy(step: int, loss: float) -> str:
        x = pad + (w - 2 * pad) * step / x_max
        y = h - pad - (h - 2 * pad) * (loss - lo) / (hi - lo)
        return f"{x:.1f},{y:.1f}"

    parts = [
        f"<svg class='convergence' viewBox='0 0 {w} {h}' width='{w}' height='{h}' role='img' "
        "aria-label='held-out loss per step'>",
        f"<line x1='{pad}' y1='{h - pad}' x2='{w - pad}' y2='{h - pad}' stroke='#999'/>",
        f"<line x1='{pad}' y1='{pad}' x2='{pad}' y2='{h - pad}' stroke='#999'/>",
        f"<text x='{pad}' y='{h - 8}' font-size='11'>step 0 … {steps[-1]}</text>",
        f"<text x='4' y='{pad - 8}' font-size='11'>held-out loss {lo:.2f} … {hi:.2f} nats</text>",
    ]
    floor_y = xy(0, v.entropy_floor).split(",")[1]
    parts.append(
        f"<line x1='{pad}' y1='{floor_y}' x2='{w - pad}' y2='{floor_y}' stroke='#bbb' "
        "stroke-dasharray='4 3'><title>entropy floor</title></line>"
    )
    for i, (name, curves) in enumerate(arms):
        colour = _COLOURS[i % len(_COLOURS)]
        band = _band(curves)
        pts = [(s, b) for s, b in zip(steps, band, strict=False) if b is not None]
        if not pts:
            continue
        upper = [xy(s, b[2]) for s, b in pts]
        lower = [xy(s, b[0]) for s, b in reversed(pts)]
        parts.append(
            f"<polygon points='{' '.join(upper + lower)}' fill='{colour}' fill-opacity='0.15' "
            "stroke='none'/>"
        )
        line = " ".join(xy(s, b[1]) for s, b in pts)
        parts.append(
            f"<polyline points='{line}' fill='none' stroke='{colour}' stroke-width='1.6'>"
            f"<title>{e(name)}</title></polyline>"
        )
        parts.append(
            f"<text x='{w - pad + 4 - 120}' y='{pad + 14 * i}' font-size='11' "
            f"fill='{colour}'>{e(name)}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def html(report: Report) -> str:
    """The HTML section: per convergence group, its curves and its verdict table."""
    conv = cases(report)
    if not conv:
        return ""
    groups: dict[str, list[CaseResult]] = {}
    for c in conv:
        groups.setdefault(c.group_id, []).append(c)
    out = ["<h2>Convergence</h2>", f"<p class='muted'>{e(WHAT_IT_SEES)}</p>"]
    for members in groups.values():
        v = members[0].convergence
        assert v is not None
        arms = [("baseline", v.baseline_curves), (f"control {v.control}", v.control_curves)]
        arms += [(c.impl, c.convergence.curves) for c in members if c.convergence is not None]
        out.append(
            f"<section class='convergence'><h3>{e(members[0].op)} "
            f"<span class='muted'>· {v.steps} steps · {len(v.seeds)} seeds · floor "
            f"{v.entropy_floor:.3f} nats</span></h3>{svg(v, arms)}"
            "<table class='cases'><thead><tr><th>impl</th><th>verdict</th>"
            "<th>Δ held-out loss</th><th>90% CI</th><th>margin</th><th>detectable</th>"
            "<th>final loss</th><th>why</th></tr></thead><tbody>"
        )
        for c in members:
            verdict, diff, ci, margin, det, final = row(c)
            out.append(
                f"<tr class='status-{e(c.status)}'><td>{e(c.impl)}</td><td>{e(verdict)}</td>"
                f"<td>{diff}</td><td>{ci}</td><td>{margin}</td><td>{det}</td><td>{final}</td>"
                f"<td>{e(c.message)}</td></tr>"
            )
        out.append("</tbody></table></section>")
    return "".join(out)
