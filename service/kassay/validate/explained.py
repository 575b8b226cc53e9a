"""The verdict on an output whose baseline is explained by its precision.

flce in a 16-bit compute dtype at |z| ~ 1e3: the baseline (eager torch) writes its logits in 16
bits, which costs its gradients ~1.4% (fp16) to ~8% (bf16) rel_l2 against the exact float64
reference; the engine found that error explained by the op's precision reference (the float64
truth on logits rounded to that dtype; kassay.validate.verdicts). "factor x the baseline's error"
against the exact reference would then pass any impl within 3% (fp16) or 16% (bf16): a 10%
non-scaling bug in bf16. Such an output of another impl instead passes by either of two rules,
each a tolerance and a bias check:

(a) accurate: every element within atol + rtol*|ref| of the exact reference and no scale against
    it beyond rounding noise (an impl that keeps float32 logits is genuinely accurate);
(b) as its precision computes: against the precision reference, max_abs and rel_l2 within
    factor x the baseline's errors there + the rounding floor, and its scale there within noise
    of the baseline's (what a correct 16-bit-logits impl computes).

The reported errors stay those against the exact reference; the verdict's reason says which rule
passed it, or gives both rules' figures and limits. The bias of (a) is against 0, not against the
baseline's: the 16-bit logits give the baseline a scale of their own (-0.16% on fp16 grad_weight
at the test shape) that an accurate impl does not share. A 0.5% scale fails both rules.
"""

from __future__ import annotations

from dataclasses import dataclass

from kassay.contract.spec import TolerancePolicy
from kassay.validate.metrics import RawMetrics
from kassay.validate.tolerance import judge
from kassay.validate.verdicts import Floor, check_bias

#: how a passing output's reason starts, per rule
ACCURATE = "accurate"
AS_PRECISION = "as its precision computes"


@dataclass(frozen=True)
class ExplainedVerdict:
    """passed/reason/policy as the tolerance verdict's (policy `absolute` when rule (a) passed
    it, else `baseline`); bias_limit: the accepted |s - s_ref| of the rule that passed (rule
    (b)'s on a failure); spread_limit: the max_abs a declared-nondeterministic impl's run-to-run
    spread must stay within."""

    passed: bool
    reason: str
    policy: str
    bias_limit: float | None
    spread_limit: float


def judge_explained(
    name: str,
    exact: RawMetrics,
    there: RawMetrics,
    base_there: RawMetrics,
    *,
    policy: TolerancePolicy,
    atol_rtol: tuple[float, float],
    floor: Floor,
    dtype_ok: bool,
    dtype_msg: str,
    precision: str,
) -> ExplainedVerdict:
    """Output `name` of an impl: `exact` are its errors against the exact reference, `there`
    against the precision reference (`precision`: the rounding it does, in words), `base_there`
    the baseline's errors there."""
    atol, rtol = atol_rtol
    floor_t = (floor.max_abs, floor.rel_l2)
    generic = judge(
        exact,
        policy=policy.model_copy(update={"policy": "absolute"}),
        base=None,
        floor=floor_t,
        dtype_ok=dtype_ok,
        dtype_msg=dtype_msg,
    )
    tol_b = judge(there, policy=policy, base=base_there, floor=floor_t, dtype_ok=True, dtype_msg="")
    t_abs = tol_b.threshold_max_abs if tol_b.threshold_max_abs is not None else atol
    t_rel = tol_b.threshold_rel_l2 if tol_b.threshold_rel_l2 is not None else 0.0
    spread = max(t_abs, atol)
    if not dtype_ok or exact.mismatched_nonfinite or (exact.all_zero and not exact.ref_all_zero):
        return ExplainedVerdict(False, generic.reason, "absolute", None, spread)
    bias_a = check_bias(name, exact, None, floor)
    bias_b = check_bias(name, there, base_there, floor, policy.factor)
    if exact.n_bad == 0 and bias_a.passed:
        why = f"{ACCURATE}: within atol {atol:.3g} + rtol {rtol:.3g}*|ref| of the exact reference"
        return ExplainedVerdict(True, why, "absolute", bias_a.limit, spread)
    b_figures = (
        f"against the reference with {precision}: max_abs {there.max_abs:.3g} (limit "
        f"{t_abs:.3g}), rel_l2 {there.rel_l2:.3g} (limit {t_rel:.3g}), {policy.factor:g} x the "
        f"explained baseline's ({base_there.max_abs:.3g}, {base_there.rel_l2:.3g}) + floor"
    )
    if tol_b.passed and bias_b.passed:
        return ExplainedVerdict(
            True, f"{AS_PRECISION}: {b_figures}", "baseline", bias_b.limit, spread
        )
    not_a = (
        f"{exact.n_bad} element(s) beyond atol {atol:.3g} + rtol {rtol:.3g}*|ref| of the exact "
        f"reference (rel_l2 {exact.rel_l2:.3g})"
        if exact.n_bad
        else f"against the exact reference: {bias_a.reason}"
    )
    not_b = b_figures if bias_b.passed else f"{b_figures}; {bias_b.reason}"
    return ExplainedVerdict(
        False,
        f"not {ACCURATE} ({not_a}) nor {AS_PRECISION} ({not_b})",
        "baseline",
        bias_b.limit,
        spread,
    )
