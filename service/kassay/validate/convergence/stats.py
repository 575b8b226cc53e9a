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

from kassay.validate.median_ratio import t_quantile


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
    half = t_quantile(0.95, len(diffs) - 1) * sd / math.sqrt(len(diffs)) if len(diffs) > 1 else 0.0
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
    return abs(m1 - m2) / se > t_quantile(0.975, df)


@dataclass(frozen=True)
class Judgement:
    """One impl's final held-out losses judged against the baseline's (matched seeds)."""

    sigma: float  # the baseline's spread across seeds
    margin: float
    diffs: list[float]  # per seed: impl - baseline (NaN where a run diverged)
    control_diffs: list[float]
    eq: Equivalence
    detectable: bool


def judge(
    finals: list[float],
    base_finals: list[float],
    control_finals: list[float],
    margin_sigma: float,
    margin_floor: float,
) -> Judgement:
    """The verdict's numbers from per-seed final losses (NaN: diverged): the margin from the
    baseline's seed spread, the TOST of the matched differences, and whether they stand out from
    the control arm's. A failed difference is detectable by definition: it lies beyond the margin
    at the verdict's level (Welch's two-sided 5% with few seeds can miss one the TOST has
    already placed outside it), and so does a diverged run's."""
    _, sigma = mean_sd([x for x in base_finals if math.isfinite(x)] or [math.nan])
    margin = max(margin_sigma * sigma, margin_floor)
    diffs = [f - b for f, b in zip(finals, base_finals, strict=True)]
    cdiffs = [c - b for c, b in zip(control_finals, base_finals, strict=True)]
    eq = equivalence(diffs, margin)
    seen = eq.verdict == "failed" or detectable(
        [d for d in diffs if math.isfinite(d)], [d for d in cdiffs if math.isfinite(d)]
    )
    return Judgement(sigma, margin, diffs, cdiffs, eq, seen)
