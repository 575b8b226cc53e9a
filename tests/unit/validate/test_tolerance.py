"""Tolerance policies: baseline (factor x baseline + rounding floor) and absolute."""

import torch

from kassay.contract.spec import TolerancePolicy
from kassay.validate.metrics import compare
from kassay.validate.tolerance import judge

REF = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)


def _m(values: list[float]):
    return compare(torch.tensor(values), REF, atol=1e-5, rtol=1.3e-6)


def test_baseline_policy_passes_within_factor_and_fails_beyond() -> None:
    base = _m([1.001, 2.0, 3.0, 4.0])
    ok = judge(
        _m([1.0015, 2.0, 3.0, 4.0]),
        policy=TolerancePolicy(),
        base=base,
        floor=(0.0, 0.0),
        dtype_ok=True,
    )
    assert ok.passed and ok.policy == "baseline"
    assert ok.threshold_max_abs is not None and abs(ok.threshold_max_abs - 0.002) < 1e-6
    bad = judge(
        _m([1.003, 2.0, 3.0, 4.0]),
        policy=TolerancePolicy(),
        base=base,
        floor=(0.0, 0.0),
        dtype_ok=True,
    )
    assert not bad.passed and "max_abs" in bad.reason


def test_rounding_floor_lets_a_perfect_baseline_be_matched_to_rounding() -> None:
    base = _m([1.0, 2.0, 3.0, 4.0])  # exact: 2 x 0 would tolerate nothing
    v = judge(
        _m([1.0 + 2**-9, 2.0, 3.0, 4.0]),
        policy=TolerancePolicy(),
        base=base,
        floor=(2**-8, 2**-8),
        dtype_ok=True,
    )
    assert v.passed


def test_nan_where_reference_finite_always_fails() -> None:
    v = judge(
        _m([float("nan"), 2.0, 3.0, 4.0]),
        policy=TolerancePolicy(factor=1e9),
        base=_m([1.0, 2.0, 3.0, 4.0]),
        floor=(1.0, 1.0),
        dtype_ok=True,
    )
    assert not v.passed and "NaN" in v.reason


def test_all_zero_output_fails_whatever_the_tolerance() -> None:
    v = judge(
        _m([0.0, 0.0, 0.0, 0.0]),
        policy=TolerancePolicy(policy="absolute", atol=100.0),
        base=None,
        floor=(0.0, 0.0),
        dtype_ok=True,
    )
    assert not v.passed and "zeros" in v.reason


def test_wrong_dtype_fails() -> None:
    v = judge(
        _m([1.0, 2.0, 3.0, 4.0]),
        policy=TolerancePolicy(),
        base=None,
        floor=(0, 0),
        dtype_ok=False,
        dtype_msg="dtype torch.float32 but the op requires bfloat16",
    )
    assert not v.passed and "requires" in v.reason


def test_absolute_policy_and_fallback_when_baseline_unusable() -> None:
    nan_base = _m([float("nan"), 2.0, 3.0, 4.0])
    v = judge(
        _m([1.0, 2.0, 3.0, 4.5]),
        policy=TolerancePolicy(),
        base=nan_base,
        floor=(0.0, 0.0),
        dtype_ok=True,
    )
    assert not v.passed and v.policy == "absolute" and "baseline unusable" in v.reason
    abs_ok = judge(
        _m([1.0, 2.0, 3.0, 4.000001]),
        policy=TolerancePolicy(policy="absolute"),
        base=None,
        floor=(0.0, 0.0),
        dtype_ok=True,
    )
    assert abs_ok.passed
