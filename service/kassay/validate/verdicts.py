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
- Bias. s = <out - ref, ref> / <ref, ref> fits out ~ (1 + s) * ref: a scale against the float64
  truth. An output is biased when |s| is beyond both factor x the baseline's own |s| (what a
  correct impl of this precision may carry: eager's 16-bit logits give its gradients a scale of
  +-0.05-0.2% that an exact impl does not share) and its rounding noise; never because it
  differs from the baseline's scale (#29: an impl exact to 1e-10 was flagged for not sharing
  eager's -0.11%). So an impl whose scale is closer to the truth than the baseline's never fails
  it. The noise: rounding errors are relative to the values they round, so the fitted scale of
  an output with rel_l2 r varies by r / sqrt(P), P the reference's participation ratio
  (sum r^2)^2 / sum r^4 (its effective number of elements: grad_weight at N=6 rows and V=2000
  carries its weight in ~N*H of its V*H elements, and rel_l2 / sqrt(V*H) flagged a correct
  chunked impl at 2x eager's draw); BIAS_SIGMAS of it, BIAS_FLOOR_FRACTION of the effective rel
  floor and a few float32 roundings of a shared factor (BIAS_MIN) are no bias. Rounding shared
  along a row is not independent: an impl that rounds each row's grad_output to bfloat16 (Liger,
  reduction none) scales each row's gradient by its own 1 + d_i, and the fit moves by a weighted
  mean of the d_i, far beyond r / sqrt(n) at a few dozen rows. The op estimates that noise
  (Op.reference_noise, SCALE_NOISE) and it joins the noise.
- Conditioning. Some sound designs lose bits where the inputs make the op ill-conditioned, and
  the baseline's own error there is luck: a softmax formed as exp(z - lse) with the lse rounded
  to float32 scales each row by 1 + d, |d| ~ u |lse| (3e-5 at |z| ~ 1e3; exp(z - max) / sum
  does not), and an lse_merge weight exp(lse_i - lse) does the same at |lse| ~ 1e4. The op
  derives, from the reference, what that costs each output (Op.reference_noise, CONDITIONING)
  and it joins the floor, so every sound design of a dtype passes.
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
    # the reference's participation ratio (sum r^2)^2 / sum r^4: its effective element count
    participation: float = 1.0


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
    conditioning: tuple[float, float] = (0.0, 0.0),
    participation: float = 1.0,
) -> Floor:
    """Rounding and accumulation errors are independent: they add in quadrature. The max_abs
    part of the accumulation floor is 5 sigma of its per-element error (rel * rms(ref)).
    noise_abs: the output's rounding noise (Op.reference_noise), one standard deviation in its
    units; NOISE_SIGMAS of it join the floor. scale_noise: the noise of the output's fitted
    scale (Floor.scale_noise). conditioning: (max_abs, rel_l2) a sound design may lose to the
    op's conditioning at these inputs (Op.reference_noise's CONDITIONING), joined as is.
    participation: the reference's effective element count (Floor.participation)."""
    acc = accumulation_rel(reduction) if reduction > 1 else 0.0
    noise_rel = NOISE_SIGMAS * noise_abs / ref_rms if ref_rms > 0 else 0.0
    rel = math.hypot(rounding[1], acc, noise_rel, conditioning[1])
    prec = (
        math.hypot(precision_rounding[1], acc, noise_rel, conditioning[1])
        if precision_rounding
        else rel
    )
    return Floor(
        max_abs=math.hypot(
            rounding[0], 5.0 * acc * ref_rms, NOISE_SIGMAS * noise_abs, conditioning[0]
        ),
        rel_l2=rel,
        precision_rel=max(rel, prec),
        scale_noise=scale_noise,
        participation=max(participation, 1.0),
    )


def participation(ref: torch.Tensor) -> float:
    """(sum r^2)^2 / sum r^4 over the finite elements of `ref`: how many elements carry its
    weight (n for a flat tensor, 1 for a one-hot one); 1.0 when there is nothing. In slices
    (_SLICE elements): a whole [V, H] float64 reference's temporaries would outgrow the memory
    its group was admitted with; one host read at the end."""
    flat = ref.detach().reshape(-1)
    sums = torch.zeros(2, dtype=torch.float64, device=flat.device)
    for i in range(0, flat.numel(), _SLICE):
        r = flat[i : i + _SLICE].double()
        r2 = torch.where(torch.isfinite(r), r * r, torch.zeros_like(r))
        sums[0] += r2.sum()
        sums[1] += r2.square_().sum()
    s2, s4 = sums.tolist()
    return s2 * s2 / s4 if s4 > 0 else 1.0


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


def check_bias(
    name: str,
    m: RawMetrics,
    base: RawMetrics | None,
    floor: Floor,
    factor: float = 2.0,
) -> BiasVerdict:
    """Is `m`'s fitted scale against the truth beyond factor x the baseline's own |s| (0 without
    a usable baseline) and beyond its rounding noise? A scale closer to the truth than the
    baseline's never is."""
    n_eff = max(min(float(max(m.n_finite, 1)), floor.participation), 1.0)
    noise = math.hypot(m.rel_l2 / math.sqrt(n_eff), floor.scale_noise)
    limit = max(BIAS_SIGMAS * noise, BIAS_FLOOR_FRACTION * floor.precision_rel, BIAS_MIN)
    s_base = base.bias if base is not None and math.isfinite(base.bias) else 0.0
    limit = max(limit, factor * abs(s_base))
    if not math.isfinite(m.bias) or abs(m.bias) <= limit:
        return BiasVerdict(True, limit)
    base_part = f", baseline's {s_base:.3g}" if base is not None else ""
    return BiasVerdict(
        False,
        limit,
        f"{name} biased by {m.bias * 100:+.2f}% against the float64 truth (fit out = (1 + s) "
        f"ref: s = {m.bias:.3g}{base_part}; |s| allowed {limit:.2g})",
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
