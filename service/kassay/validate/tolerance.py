"""Tolerance verdicts: does one output's error pass the suite's policy?

`baseline` (default): max_abs <= factor * baseline.max_abs + floor_abs and
rel_l2 <= factor * baseline.rel_l2 + floor_rel, where the baseline is the same-dtype baseline
impl's error on the same inputs and the floor is the error of the reference rounded to the
output's dtype (FlashAttention's test convention) combined with the float32 accumulation floor
of the output's reduction length (kassay.validate.verdicts). When the baseline has no usable
error (it raised, produced NaN/Inf where the reference is finite, or is suspect: far above the
floor and beyond atol/rtol) the output is judged by `absolute`. When the baseline's error is
explained by the case's precision (kassay.validate.verdicts: flce's 16-bit logits) its error
against the exact reference is percents, and "factor x" that would let percent-level bugs through;
such an output is judged by kassay.validate.explained instead.
`absolute`: every element within atol + rtol * |ref| (torch.testing's per-dtype defaults).
Whatever the policy: NaN/Inf where the reference is finite fails, a wrong dtype fails where the
op requires its dtype, and an output that is all zeros where the reference is not fails (an
unwritten or zeroed output).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kassay.contract.spec import TolerancePolicy
from kassay.validate.metrics import DEFAULT_TOLERANCES, RawMetrics


@dataclass
class Verdict:
    passed: bool
    reason: str
    policy: str
    threshold_max_abs: float | None = None
    threshold_rel_l2: float | None = None


def tolerances(policy: TolerancePolicy, dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) for the absolute policy and for the n_bad count."""
    rtol, atol = DEFAULT_TOLERANCES.get(dtype, DEFAULT_TOLERANCES[torch.float32])
    return (
        policy.atol if policy.atol is not None else atol,
        policy.rtol if policy.rtol is not None else rtol,
    )


def baseline_usable(base: RawMetrics | None) -> bool:
    return base is not None and base.mismatched_nonfinite == 0


def judge(
    m: RawMetrics,
    *,
    policy: TolerancePolicy,
    base: RawMetrics | None,
    floor: tuple[float, float],
    dtype_ok: bool,
    dtype_msg: str = "",
    base_suspect: bool = False,
) -> Verdict:
    if not dtype_ok:
        return Verdict(False, dtype_msg, policy.policy)
    if m.mismatched_nonfinite:
        return Verdict(False, nonfinite_reason(m), policy.policy)
    if m.all_zero and not m.ref_all_zero:
        return Verdict(
            False, "output is all zeros (unwritten?) while the reference is not", policy.policy
        )
    if policy.policy == "baseline" and baseline_usable(base) and not base_suspect:
        assert base is not None
        t_abs = policy.factor * base.max_abs + floor[0]
        t_rel = policy.factor * base.rel_l2 + floor[1]
        fails = []
        if m.max_abs > t_abs:
            fails.append(f"max_abs {m.max_abs:.3g} > {t_abs:.3g}")
        if m.rel_l2 > t_rel:
            fails.append(f"rel_l2 {m.rel_l2:.3g} > {t_rel:.3g}")
        reason = (
            "; ".join(fails) + f" ({policy.factor:g} x baseline + rounding floor)" if fails else ""
        )
        return Verdict(not fails, reason, "baseline", t_abs, t_rel)
    note = (
        ""
        if policy.policy == "absolute"
        else " (baseline suspect: absolute policy applied)"
        if base_suspect
        else " (baseline unusable: absolute policy applied)"
    )
    if m.n_bad:
        return Verdict(False, f"{m.n_bad} element(s) beyond atol + rtol*|ref|{note}", "absolute")
    return Verdict(True, note.strip(), "absolute")


def nonfinite_reason(m: RawMetrics) -> str:
    """Say what happened where out and ref disagree on finiteness: NaN/Inf where the reference
    is finite, a finite value where the reference is infinite (e.g. an empty row's -inf lse
    written as a number), or the opposite infinity."""
    parts = []
    if m.nonfinite_where_finite:
        parts.append(f"{m.nonfinite_where_finite} NaN/Inf element(s) where the reference is finite")
    if m.finite_where_inf:
        parts.append(f"{m.finite_where_inf} finite element(s) where the reference is ±inf")
    other = m.mismatched_nonfinite - m.nonfinite_where_finite - m.finite_where_inf
    if other:
        parts.append(f"{other} element(s) NaN or the opposite infinity where the reference is ±inf")
    return "; ".join(parts) + f" (nan={m.nan}, inf={m.inf}, reference inf={m.ref_inf})"
