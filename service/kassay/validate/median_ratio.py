"""Is one run of a case slower than another? The ratio of the two runs' medians, with a
confidence interval from both runs' samples.

Plain Python (the API that compares jobs carries no numpy or scipy).

Why batch medians. Repetitions of a timing loop are not independent draws: a shared host, a
clock that changes, a throttling device make neighbouring repetitions alike (bursts of slow
ones). A test that takes n samples as n independent draws (Welch's t on the samples,
Mann-Whitney, the plain bootstrap, the order-statistic interval of the median) is then too
sure of itself and flags noise as a change. The batch-means method of simulation output
analysis is built for such series: cut a run's samples, in the order they were measured, into
B consecutive batches (5, or fewer for short runs: few long batches stay honest under longer
bursts than many short ones, at the price of a wider t); the batch statistics are close to independent even when the samples are
not, so their spread gives an honest standard error, slow drift within the run included. Medians
of the batches (not means) keep one stalled repetition from moving anything.

The ratio is taken on the log scale, where a ratio is a difference and where timings are closer
to symmetric: the standard error of each run's log-median is sd(log batch medians) / sqrt(B);
the two runs are independent, so their variances add; the interval uses Student's t with the
Welch-Satterthwaite degrees of freedom. The default confidence is 99% two-sided: a job compares
hundreds of cases, and at 95% one unchanged case in forty would look significant by chance.

A run with too few samples for three batches (or a result stored before samples were kept)
falls back to the timing statistics' rel_sem (the normal-theory standard error of the median,
1.2533 * std / sqrt(n), relative to it) with n - 1 degrees of freedom.

Host-normalised runs. On the CPU each repetition is followed by a fixed calibration workload
(kassay.validate.host_calibration); `paired_run` makes a Run of the ratios repetition /
calibration, in the order measured, and the same interval applies to them. The host's speed of
the moment divides out of every ratio, so what drifts between two jobs on a shared runner (5-40%
in process CPU time) leaves the ratio of their medians; the pairing also narrows each run's
spread, since a repetition and its calibration share the moment's load.

What no run's samples show. The calibration does not track the case exactly (other code feels a
busy neighbour differently; a process's memory layout moves its speed by a few percent): one job's
host-normalised median still sits off the code's own by about 3% (HOST_NORMALISED_JOB_SD: the
standard deviation over 12 jobs of the same code on the shared 2-core development box, where
the plain medians moved by 13%; bench/README.md, "Comparisons: noise"). A job's samples cannot
see that spread, so `job_sd` adds it to each run's variance (with no degrees of freedom lost: it
is taken as known); without it a 5% offset came out "significant" at a 1.5% standard error.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_CONFIDENCE = 0.99
#: the spread (sd of the log) of one job's host-normalised median beyond its samples' (see above)
HOST_NORMALISED_JOB_SD = 0.03
#: at most this many batches; fewer when a run has under 3 samples per batch
MAX_BATCHES = 5
MIN_BATCHES = 3


@dataclass(frozen=True)
class Run:
    """One run's timing of one case: its median, its samples in the order measured (may be
    empty), and the fallbacks when they are too few: rel_sem and the number of repetitions."""

    median: float
    samples: Sequence[float] = ()
    rel_sem: float = 0.0
    n: int = 0


@dataclass(frozen=True)
class RatioCI:
    """new median / old median, and the interval [low, high] at `confidence`."""

    ratio: float
    low: float
    high: float
    confidence: float
    method: str  # "batch_medians" when both runs had enough samples, else "rel_sem"


def paired_run(samples: Sequence[float], calibration: Sequence[float]) -> Run | None:
    """The run of paired ratios samples[i] / calibration[i] (a host-normalised timing), or None
    when the two do not pair up (other lengths, under 2 samples, a non-positive time)."""
    if len(samples) != len(calibration) or len(samples) < 2:
        return None
    if min(samples) <= 0 or min(calibration) <= 0:
        return None
    ratios = [s / c for s, c in zip(samples, calibration, strict=True)]
    med = statistics.median(ratios)
    sem = 1.2533 * statistics.stdev(ratios) / math.sqrt(len(ratios))
    return Run(median=med, samples=ratios, rel_sem=sem / med, n=len(ratios))


def t_quantile(p: float, dof: float) -> float:
    """The p-quantile of Student's t with `dof` degrees of freedom (p in (0.5, 1)).

    Exact for 1 and 2 degrees of freedom; above, the Cornish-Fisher expansion of t around the
    normal quantile (Abramowitz & Stegun 26.7.5): within 1% of the tables from 3 dof on, and
    a little low (so a little less strict) between 2 and 3."""
    z = statistics.NormalDist().inv_cdf(p)
    if dof <= 1:
        return math.tan(math.pi * (p - 0.5))
    if dof <= 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    v = dof
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / v + g2 / v**2 + g3 / v**3 + g4 / v**4


def _batches(samples: Sequence[float]) -> list[Sequence[float]]:
    n = len(samples)
    b = min(MAX_BATCHES, n // 3)
    if b < MIN_BATCHES:
        return []
    return [samples[i * n // b : (i + 1) * n // b] for i in range(b)]


def log_median_se(run: Run) -> tuple[float, float, str]:
    """(standard error of log(median), its degrees of freedom, method) for one run."""
    positive = [s for s in run.samples if s > 0]
    batches = _batches(positive) if len(positive) == len(run.samples) else []
    if batches:
        logs = [math.log(statistics.median(b)) for b in batches]
        return statistics.stdev(logs) / math.sqrt(len(logs)), len(logs) - 1.0, "batch_medians"
    n = run.n or len(run.samples)
    return run.rel_sem, max(n - 1.0, 1.0), "rel_sem"


def median_ratio(
    new: Run, old: Run, *, confidence: float = DEFAULT_CONFIDENCE, job_sd: float = 0.0
) -> RatioCI:
    """The ratio new.median / old.median with its `confidence` interval (see the module).
    `job_sd`: the spread of a run's log-median between jobs that its samples cannot show,
    added to each run's variance (HOST_NORMALISED_JOB_SD for host-normalised CPU runs)."""
    if new.median <= 0 or old.median <= 0:
        raise ValueError("medians must be positive to take their ratio")
    se_new, dof_new, m_new = log_median_se(new)
    se_old, dof_old, m_old = log_median_se(old)
    log_ratio = math.log(new.median) - math.log(old.median)
    sampled = se_new**2 + se_old**2
    var = sampled + 2 * job_sd**2
    if var > 0:
        # Welch-Satterthwaite; the job_sd term is known (infinite degrees of freedom)
        dof = var**2 / (se_new**4 / dof_new + se_old**4 / dof_old) if sampled > 0 else math.inf
        half = t_quantile(0.5 + confidence / 2, dof) * math.sqrt(var)
    else:
        half = 0.0
    method = "batch_medians" if m_new == m_old == "batch_medians" else "rel_sem"
    return RatioCI(
        ratio=math.exp(log_ratio),
        low=math.exp(log_ratio - half),
        high=math.exp(log_ratio + half),
        confidence=confidence,
        method=method,
    )
