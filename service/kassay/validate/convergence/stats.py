"""The convergence verdict: equivalence of matched held-out losses (two one-sided tests).

Per seed s, d_s = candidate's held-out loss - the baseline's (same initial weights, same data).
The 90% confidence interval of mean(d) (Student's t, n - 1 degrees of freedom) decides against
the margin delta = max(margin_sigma * sigma_seed, margin_floor), sigma_seed being the baseline's
own spread of held-out loss across seeds (what changing the seed alone moves):
- inside (-delta, delta): `passed` (equivalent at 5% per side, the TOST);
- entirely outside [-delta, delta], or a loss that is not finite or diverged: `failed`;
- otherwise `inconclusive`: more seeds would decide.
`detectable` says whether the candidate's differences stand out from the control arm's (a
correct alternative implementation: the benign band of differences between correct kernels),
by Welch's t at 5% two-sided, even where they are not material.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Student's t quantiles, 0.95 one-sided (the TOST's 90% interval), by degrees of freedom
_T95 = {
    1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833,
    10: 1.812, 12: 1.782, 15: 1.753, 20: 1.725, 25: 1.708, 30: 1.697, 60: 1.671,
}  # fmt: skip
#: and 0.975 (Welch's two-sided 5%)
_T975 = {
    1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
    10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 60: 2.000,
}  # fmt: skip


def t_quantile(df: float, table: dict[int, float]) -> float:
    """The quantile at `df` degrees of freedom: the table's entry at or below it (conservative),
    the normal's beyond 60."""
    if df >= 120:
        return 1.645 if table is _T95 else 1.960
    keys = [k for k in sorted(table) if k <= max(1.0, df)]
    return table[keys[-1]]


def mean_sd(xs: list[float]) -> tuple[float, float]:
    n = len(xs)
    m = sum(xs) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1)) if n > 1 else 0.0
    return m, sd


@dataclass(frozen=True)
class Equivalence:
    verdict: str  # passed | failed | inconclusive
    mean: float
    low: float
    high: float
    margin: float
    reason: str


def equivalence(diffs: list[float], margin: float) -> Equivalence:
    """The TOST of matched differences against +-margin (see the module docstring)."""
    if not diffs or not all(math.isfinite(d) for d in diffs):
        return Equivalence("failed", math.nan, math.nan, math.nan, margin, "a loss is not finite")
    m, sd = mean_sd(diffs)
    half = t_quantile(len(diffs) - 1, _T95) * sd / math.sqrt(len(diffs)) if len(diffs) > 1 else 0.0
    low, high = m - half, m + half
    if -margin < low and high < margin:
        return Equivalence("passed", m, low, high, margin, "")
    if low > margin or high < -margin:
        why = f"held-out loss {m:+.4g} nats (90% CI [{low:+.3g}, {high:+.3g}]) beyond the margin"
        return Equivalence("failed", m, low, high, margin, why + f" +-{margin:.3g}")
    return Equivalence(
        "inconclusive",
        m,
        low,
        high,
        margin,
        f"90% CI [{low:+.3g}, {high:+.3g}] straddles the margin +-{margin:.3g}: more seeds decide",
    )


def detectable(diffs: list[float], control: list[float]) -> bool:
    """Whether diffs differ from the control arm's differences (Welch's t, 5% two-sided)."""
    if len(diffs) < 2 or len(control) < 2:
        return False
    m1, s1 = mean_sd(diffs)
    m2, s2 = mean_sd(control)
    v1, v2 = s1**2 / len(diffs), s2**2 / len(control)
    se = math.sqrt(v1 + v2)
    if se == 0:
        return m1 != m2
    df = (v1 + v2) ** 2 / (
        (v1**2 / (len(diffs) - 1) if v1 else 0) + (v2**2 / (len(control) - 1) if v2 else 0)
    )
    return abs(m1 - m2) / se > t_quantile(df, _T975)
