"""What a convergence job's verdicts would have been at each earlier eval step: reads the JSON
report of a convergence job (`kassay run --json`, or a bench/results file that wraps one under
"report") and judges every case on its curves cut at each eval step, with that step's margin
(the baseline's seed spread there). Used to choose the default horizon of
examples/convergence.yaml: past the capability transition, before matched runs drift apart.

    python bench/convergence_horizon.py bench/results/convergence-h200-2026-12-05.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from typing import Any

from kassay.contract.spec import ConvergencePolicy
from kassay.validate.convergence import stats
from kassay.validate.convergence.runner import DIVERGED_OVER_UNIFORM


@dataclass(frozen=True)
class Point:
    case: str  # op.impl
    step: int
    baseline_loss: float  # mean over seeds
    sigma: float
    eq: stats.Equivalence
    detectable: bool


def _at(curve: list[float | None], i: int, limit: float) -> float:
    """A run's loss at eval step i as the runner judges it: NaN once it diverged (its curve
    stops early, or the loss is past the uniform guess + DIVERGED_OVER_UNIFORM)."""
    x = curve[i] if i < len(curve) else None
    return math.nan if x is None or x > limit else x


def horizon(report: dict[str, Any], margin_sigma: float, margin_floor: float) -> list[Point]:
    points = []
    for case in report["cases"]:
        conv = case.get("convergence")
        if not conv:
            continue
        limit = conv["uniform_loss"] + DIVERGED_OVER_UNIFORM
        for i, step in enumerate(conv["eval_steps"]):
            impl, base, ctrl = (
                [_at(c, i, limit) for c in conv[key]]
                for key in ("curves", "baseline_curves", "control_curves")
            )
            j = stats.judge(impl, base, ctrl, margin_sigma, margin_floor)
            ok = [b for b in base if math.isfinite(b)]
            loss = sum(ok) / len(ok) if ok else math.nan
            points.append(
                Point(f"{case['op']}.{case['impl']}", step, loss, j.sigma, j.eq, j.detectable)
            )
    return points


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("report")
    defaults = ConvergencePolicy()
    ap.add_argument("--margin-sigma", type=float, default=defaults.margin_sigma)
    ap.add_argument("--margin-floor", type=float, default=defaults.margin_floor)
    a = ap.parse_args()
    with open(a.report) as f:
        data = json.load(f)
    report = data.get("report", data)
    last = ""
    for p in horizon(report, a.margin_sigma, a.margin_floor):
        if p.case != last:
            print(p.case)
            last = p.case
        e = p.eq
        print(
            f"  step {p.step:5d} baseline {p.baseline_loss:.4f} sigma {p.sigma:.4f} "
            f"margin {e.margin:.4f} mean {e.mean:+.4f} CI [{e.low:+.4f}, {e.high:+.4f}] "
            f"{e.verdict:12s}{' detectable' if p.detectable else ''}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
