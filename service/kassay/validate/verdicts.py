"""Verdict checks beyond the tolerance: is the baseline itself trustworthy, is an output scaled
by a systematic factor, and does an impl give the same bits twice?

- Accumulation floor. The rounding floor (the reference rounded to the output dtype) ignores
  that an element is itself a long float32 sum. A float32 sequential accumulation of L terms of
  random sign has an expected relative error of about u * sqrt(L / 6) (u = 2^-24: each of the L
  additions adds a uniform rounding error of variance u^2/3 times a partial sum of rms
  sqrt(k) * sigma, against a result of rms sqrt(L) * sigma). Two correct float32 GEMMs (cuBLAS
  with and without split-K, at different row counts) differ by that much; "2 x the baseline"
  alone would fail whichever of them was not the baseline. The floor only matters for float32
  outputs of long reductions (flce's grad_input at V = 128256: 8.7e-6); for 16-bit outputs the
  dtype's own rounding dominates.
- Rounding noise. Some outputs inherit the noise of an intermediate every impl rounds in its
  own way: flce's scalar loss sums the effect of N x V logits written in 16 bits, once (eager's
  addmm, bias in) or twice (Liger: mm, then + bias). One impl's loss error is then one draw of
  that noise and another's a partly independent draw, so "2 x the baseline's error" alone fails
  correct impls about one time in three. The op estimates the noise from the float64 reference
  (Op.reference_noise: sigma^2 = sum (dL/dz z)^2 h^2 / 3, h the dtype's half spacing) and
  NOISE_SIGMAS of it join the output's floor.
- Baseline suspect. The baseline's error sets everyone's limits, so it is judged first: a rel_l2
  above SUSPECT_FLOOR_RATIO x the effective floor (in the output's precision) and above
  SUSPECT_MIN_REL, together with elements beyond the absolute policy's atol + rtol*|ref|, means
  the baseline is wrong here. It then fails, and the other impls
  are judged by the absolute policy. Unless the case's precision explains the error: some
  correct results are far from the exact truth because every impl of that precision rounds
  something the reference does not (flce's 16-bit logits at |z| ~ 1e3 cost eager's fp16
  gradients 1.4% rel_l2). When the op has such a precision reference (`Op.precision_reference`)
  the engine judges the baseline again by this same rule against it; not suspect there, the
  baseline is explained (flag baseline_explained) and a real bug, off against both references,
  stays suspect. Its percents against the exact truth do not become everyone's limits: on that
  output the others pass when accurate against the exact reference or when within factor x the
  baseline's error against the precision reference (kassay.validate.explained).
- Bias. s = <out - ref, ref> / <ref, ref> fits out ~ (1 + s) * ref. Independent rounding errors
  leave |s| ~ rel_l2 / sqrt(n); an output whose s departs from the baseline's by more than
  BIAS_SIGMAS of that noise, more than BIAS_FLOOR_FRACTION of the effective rel floor and more
  than a few float32 roundings of a shared factor (BIAS_MIN) is biased (e.g. a gradient scaled
  by 0.5 % in bfloat16 sits inside 2 x the baseline's error). Rounding shared along a row is
  not independent: an impl that rounds each row's grad_output to bfloat16 (Liger, reduction
  none) scales each row's gradient by its own 1 + d_i, and the fit moves by a weighted mean of
  the d_i, far beyond rel_l2 / sqrt(n) at a few dozen rows (a simulation of it at N=45 V=200
  was flagged on 30 of 100 seeds). The op estimates that noise (Op.reference_noise,
  SCALE_NOISE) and sqrt(2) of it, for the impl's draw and the baseline's, joins the noise.
- Determinism. Two runs on the same inputs must give the same bits unless the impl declares
  itself nondeterministic; then their spread must stay within the output's max_abs limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kassay.validate.metrics import RawMetrics

UNIT_ROUNDOFF_F32 = 2.0**-24
SUSPECT_FLOOR_RATIO = 32.0
# Conditioning, not rounding, bounds some correct results: float32 lse near 1e4 or logits near
# 1e3 cost correct impls ~1e-4 of rel_l2 whatever the output dtype. A baseline is suspect only
# beyond this too: a 1% error is never a rounding matter.
SUSPECT_MIN_REL = 1e-2
BIAS_SIGMAS = 8.0
BIAS_FLOOR_FRACTION = 0.25
# An output's rounding noise (a scalar loss computed from logits every impl rounds in its own
# way) joins its floor at this many standard deviations: one impl's error is a single draw of it
# and another's partly independent, so 2 x the baseline's draw alone fails correct impls (a
# logit rounded twice, as Liger does with a bias, failed 68 of 200 simulated cases).
NOISE_SIGMAS = 4.0
# A correct float32 pipeline rounds shared scale factors (1/n, grad_output) a few times: a scale
# of a few u is no bias.
BIAS_MIN = 8 * UNIT_ROUNDOFF_F32


@dataclass(frozen=True)
class Floor:
    """The tolerance floor of one output: (max_abs, rel_l2) of rounding the reference to the
    output dtype, combined with the float32 accumulation floor of its reduction length.
    precision_rel: the same rel_l2 floor with the rounding done in the output's precision dtype
    (the autocast dtype of an AMP case): what the baseline's error and a bias are measured
    against."""

    max_abs: float
    rel_l2: float
    precision_rel: float = 0.0
    # one standard deviation of the fitted scale s from rounding shared along the output's rows
    # (Op.reference_noise's SCALE_NOISE): the bias check's independent-element noise misses it
    scale_noise: float = 0.0


def accumulation_rel(reduction: int) -> float:
    """Expected rel_l2 of one float32 sequential accumulation of `reduction` terms."""
    return UNIT_ROUNDOFF_F32 * math.sqrt(max(reduction, 1) / 6.0)


def effective_floor(
    rounding: tuple[float, float],
    reduction: int,
    ref_rms: float,
    precision_rounding: tuple[float, float] | None = None,
    noise_abs: float = 0.0,
    scale_noise: float = 0.0,
) -> Floor:
    """Rounding and accumulation errors are independent: they add in quadrature. The max_abs
    part of the accumulation floor is 5 sigma of its per-element error (rel * rms(ref)).
    noise_abs: the output's rounding noise (Op.reference_noise), one standard deviation in its
    units; NOISE_SIGMAS of it join the floor. scale_noise: the noise of the output's fitted
    scale (Floor.scale_noise)."""
    acc = accumulation_rel(reduction) if reduction > 1 else 0.0
    noise_rel = NOISE_SIGMAS * noise_abs / ref_rms if ref_rms > 0 else 0.0
    rel = math.hypot(rounding[1], acc, noise_rel)
    prec = math.hypot(precision_rounding[1], acc, noise_rel) if precision_rounding else rel
    return Floor(
        max_abs=math.hypot(rounding[0], 5.0 * acc * ref_rms, NOISE_SIGMAS * noise_abs),
        rel_l2=rel,
        precision_rel=max(rel, prec),
        scale_noise=scale_noise,
    )


def ref_rms(ref: torch.Tensor) -> float:
    r = ref.detach().reshape(-1)
    fin = torch.isfinite(r)
    n = int(fin.sum())
    if n == 0:
        return 0.0
    rf = torch.where(fin, r, torch.zeros_like(r)).double()
    return float((rf * rf).sum() / n) ** 0.5


def suspect_reason(base: RawMetrics, floor: Floor) -> str | None:
    """Why the baseline's own error on this output is not to be trusted, or None."""
    if base.mismatched_nonfinite or base.n_bad == 0:
        return None  # non-finite baselines are already unusable; within atol/rtol is fine
    ref = floor.precision_rel
    if base.rel_l2 <= max(SUSPECT_FLOOR_RATIO * ref, SUSPECT_MIN_REL):
        return None
    return (
        f"baseline suspect: rel_l2 {base.rel_l2:.3g} is {base.rel_l2 / ref:.0f}x the "
        f"rounding floor and {base.n_bad} element(s) are beyond atol + rtol*|ref|; "
        "its limits are not used"
    )


@dataclass(frozen=True)
class BiasVerdict:
    passed: bool
    limit: float
    reason: str = ""


def check_bias(name: str, m: RawMetrics, base: RawMetrics | None, floor: Floor) -> BiasVerdict:
    """Is `m`'s fitted scale beyond the baseline's (0 without a usable baseline) by more than
    rounding noise allows?"""
    n = max(m.n_finite, 1)
    s_base = base.bias if base is not None else 0.0
    noise = (m.rel_l2 + (base.rel_l2 if base is not None else 0.0)) / math.sqrt(n)
    # the impl and the baseline may each draw the shared-rounding scale noise
    noise = math.hypot(noise, math.sqrt(2.0) * floor.scale_noise)
    limit = max(BIAS_SIGMAS * noise, BIAS_FLOOR_FRACTION * floor.precision_rel, BIAS_MIN)
    dev = m.bias - s_base
    if not math.isfinite(dev) or abs(dev) <= limit:
        return BiasVerdict(True, limit)
    return BiasVerdict(
        False,
        limit,
        f"{name} biased by {dev * 100:+.2f}% (fit out = (1 + s) ref: s = {m.bias:.3g}, "
        f"baseline's {s_base:.3g}, noise allows {limit:.2g})",
    )


@dataclass(frozen=True)
class RunToRun:
    identical: bool
    max_abs: float  # max |a - b| where both are finite; inf when non-finite patterns differ
    n_diff: int


def run_to_run(a: torch.Tensor, b: torch.Tensor) -> RunToRun:
    """Bit-for-bit comparison of two runs' copies of one output."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return RunToRun(False, float("inf"), a.numel())
    if a.is_floating_point():
        ia = a.detach().contiguous().view(-1).view(_int_of(a.dtype))
        ib = b.detach().contiguous().view(-1).view(_int_of(b.dtype))
        diff = ia != ib
    else:
        diff = (a != b).reshape(-1)
    n_diff = int(diff.sum())
    if n_diff == 0:
        return RunToRun(True, 0.0, 0)
    if not a.is_floating_point():
        return RunToRun(False, float("inf"), n_diff)
    # float64 copies of a whole output (a [V, H] grad_weight is ~4 GiB each) would outgrow the
    # memory the case was admitted with: compare in slices.
    fa, fb = a.detach().reshape(-1), b.detach().reshape(-1)
    worst = 0.0
    for i in range(0, fa.numel(), _SLICE):
        a64, b64 = fa[i : i + _SLICE].double(), fb[i : i + _SLICE].double()
        fin = torch.isfinite(a64) & torch.isfinite(b64)
        same_nonfinite = (~fin) & ((a64 == b64) | (torch.isnan(a64) & torch.isnan(b64)))
        if bool((~fin & ~same_nonfinite).any()):
            return RunToRun(False, float("inf"), n_diff)
        d = torch.where(fin, (a64 - b64).abs(), torch.zeros_like(a64))
        worst = max(worst, float(d.max()))
    return RunToRun(False, worst, n_diff)


#: elements per float64 slice in run_to_run (128 MiB a copy)
_SLICE = 1 << 24


def _int_of(dtype: torch.dtype) -> torch.dtype:
    return {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}[dtype.itemsize]
