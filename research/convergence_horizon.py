"""What a convergence job's verdicts would have been at each earlier eval step: reads the JSON
report of `kassay run` (a convergence job) and judges every case on its curves cut at each eval
step, with the margin of that step (the baseline's seed spread there). Used to choose the
default horizon of examples/convergence.yaml (past the capability transition, before matched
runs drift apart).

    python research/convergence_horizon.py bench/results/convergence-h200-2026-12-05.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from kassay.validate.convergence import stats


def _final(curve: list[float | None], i: int) -> float:
    x = curve[i] if i < len(curve) else None
    return math.nan if x is None else x


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report")
    ap.add_argument("--margin-sigma", type=float, default=0.25)
    ap.add_argument("--margin-floor", type=float, default=0.005)
    a = ap.parse_args()
    with open(a.report) as f:
        report = json.load(f)
    for case in report["cases"]:
        conv = case.get("convergence")
        if not conv:
            continue
        print(f"{case['op']}.{case['impl']}")
        for i, step in enumerate(conv["eval_steps"]):
            base = [_final(c, i) for c in conv["baseline_curves"]]
            mine = [_final(c, i) for c in conv["curves"]]
            ctrl = [_final(c, i) for c in conv["control_curves"]]
            finite = [b for b in base if math.isfinite(b)]
            _, sigma = stats.mean_sd(finite or [math.nan])
            margin = max(a.margin_sigma * sigma, a.margin_floor)
            diffs = [m - b for m, b in zip(mine, base, strict=True)]
            cdiffs = [c - b for c, b in zip(ctrl, base, strict=True)]
            eq = stats.equivalence(diffs, margin)
            det = all(map(math.isfinite, diffs)) and stats.detectable(
                diffs, [d for d in cdiffs if math.isfinite(d)]
            )
            loss = sum(finite) / len(finite) if finite else math.nan
            print(
                f"  step {step:5d} base {loss:.4f} sigma {sigma:.4f} margin {margin:.4f} "
                f"mean {eq.mean:+.4f} CI [{eq.low:+.4f}, {eq.high:+.4f}] {eq.verdict:12s}"
                f"{' detectable' if det else ''}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
