"""Verdict checks beyond the tolerance: a suspect baseline, determinism, systematic bias, the
float32 accumulation floor, and what the messages say."""

from __future__ import annotations

import math

import pytest
import torch

from kassay.contract.results import CaseResult
from kassay.contract.spec import GroupSpec, TimingPolicy
from kassay.impls import Impl, get_impl, load, register
from kassay.validate.engine import run_group
from kassay.validate.metrics import compare
from kassay.validate.tolerance import nonfinite_reason
from kassay.validate.verdicts import accumulation_rel, effective_floor

_L = {"T": 64, "Hh": 4, "D": 16, "K": 3, "dtype": "float32"}


def _run(
    op: str,
    params: dict,
    impls: list[str],
    regime: str = "normal",
    baseline: str = "torch",
    timed: bool = False,
) -> dict[str, CaseResult]:
    load(mutants=True)
    timing = (
        TimingPolicy(warmup=0, min_reps=1, max_reps=2, budget_s=0.2)
        if timed
        else TimingPolicy(enabled=False)
    )
    g = GroupSpec(
        group_id="t",
        op=op,
        params=params,
        regime=regime,
        impls=impls,
        baseline=baseline,
        timing=timing,
    )
    cases = run_group(g, device="cpu", include_mutants=True, ceilings=False)
    return {c.impl: c for c in cases}


@pytest.mark.parametrize("regime", ["empty_rows", "fa2_inf"])
def test_torch_step_gives_zero_on_rows_empty_in_every_state(regime: str) -> None:
    res = _run("lse_merge", {**_L, "dtype": "float16", "mode": "step"}, ["torch"], regime)
    out = next(o for o in res["torch"].outputs if o.name == "out")
    assert res["torch"].status == "passed", res["torch"].message
    assert out.rel_l2 < 1e-3  # it was 0.24-0.58 while empty rows kept state 0's out


def test_a_wrong_baseline_is_suspect_and_does_not_widen_limits() -> None:
    p = {**_L, "mode": "step"}
    res = _run(
        "lse_merge",
        p,
        ["m_stale_empty_baseline", "kassay", "m_garbage_empty"],
        "empty_rows",
        baseline="m_stale_empty_baseline",
    )
    base = res["m_stale_empty_baseline"]
    assert base.status == "failed" and "baseline_suspect" in base.flags
    assert "baseline suspect" in base.message
    assert res["kassay"].status == "passed", res["kassay"].message
    assert "baseline_suspect" in res["kassay"].flags  # its limits fell back, and it says so
    bad = res["m_garbage_empty"]
    assert bad.status == "failed", bad.message
    # a trusted baseline (torch) leaves no flag
    ok = _run("lse_merge", p, ["torch", "kassay"], "empty_rows")
    assert all(not c.flags and c.status == "passed" for c in ok.values())


def test_different_bits_on_a_second_run_fail_unless_declared() -> None:
    p = {**_L, "K": 8, "mode": "merge"}
    for timed in (False, True):  # the second run is an extra call, or the timing loop's
        res = _run("lse_merge", p, ["torch", "m_unordered_merge"], timed=timed)
        c = res["m_unordered_merge"]
        assert c.status == "failed" and c.flags == ["nondeterministic"], c.message
        assert "nondeterministic" in c.message
        assert res["torch"].status == "passed"
        assert all(o.run_to_run_max_abs == 0 for o in res["torch"].outputs)
    declared = get_impl("lse_merge", "m_unordered_merge", include_mutants=True)
    register(
        Impl(
            "lse_merge",
            "t_declared_unordered",
            declared.run,
            kind="testing",
            nondeterministic=True,
        ),
        replace=True,
    )
    load(testing=True)
    g = GroupSpec(
        group_id="t",
        op="lse_merge",
        params=p,
        impls=["torch", "t_declared_unordered"],
        timing=TimingPolicy(enabled=False),
    )
    c = run_group(g, device="cpu", include_testing=True, ceilings=False)[1]
    assert c.status == "passed", c.message
    assert c.flags == ["nondeterministic"]
    out = next(o for o in c.outputs if o.name == "out")
    assert out.run_to_run_max_abs is not None and 0 < out.run_to_run_max_abs < 1e-5


def test_a_systematic_scale_within_the_tolerance_is_reported_as_bias() -> None:
    p = {"T": 64, "Hh": 4, "D": 32, "K": 4, "dtype": "float16", "mode": "merge"}
    res = _run("lse_merge", p, ["torch", "kassay", "m_truncating_round"])
    assert res["torch"].status == "passed" and res["kassay"].status == "passed"
    bad = res["m_truncating_round"]
    out = next(o for o in bad.outputs if o.name == "out")
    # each element is within one ULP: the tolerance alone would pass it
    assert out.rel_l2 <= out.threshold_rel_l2  # type: ignore[operator]
    assert bad.status == "failed" and bad.flags == ["biased"]
    assert "out biased by -0.0" in bad.message


def test_correct_bf16_flce_impls_are_not_flagged_as_biased() -> None:
    # torch vs torch_compile-free correct impls on CPU: kassay's bf16 path needs a GPU (the
    # interpreter's tl.dot); the bias check must leave a correct bf16 impl alone.
    p = {"N": 256, "H": 64, "V": 96, "dtype": "bfloat16"}
    res = _run("flce", p, ["torch"])
    for o in res["torch"].outputs:
        assert o.bias is not None and abs(o.bias) < 0.25 * 2**-8
    res = _run("flce", {**p, "dtype": "float16"}, ["torch", "kassay"])
    assert res["kassay"].status == "passed", res["kassay"].message


def test_an_update_that_forgets_the_float32_accumulator_is_caught_in_float32() -> None:
    res = _run("lse_merge", {**_L, "K": 4, "mode": "step"}, ["torch", "m_stale_acc"])
    assert res["torch"].status == "passed"
    assert res["m_stale_acc"].status == "failed"


def test_finite_where_the_reference_is_infinite_is_said_as_such() -> None:
    ref = torch.tensor([1.0, -math.inf, 2.0], dtype=torch.float64)
    m = compare(torch.tensor([1.0, -80.0, 2.0]), ref, atol=1e-5, rtol=1e-5)
    assert "1 finite element(s) where the reference is ±inf" in nonfinite_reason(m)
    assert "where the reference is finite" not in nonfinite_reason(m)
    m = compare(torch.tensor([math.nan, -math.inf, 2.0]), ref, atol=1e-5, rtol=1e-5)
    assert nonfinite_reason(m).startswith("1 NaN/Inf element(s) where the reference is finite")


def test_float32_accumulation_floor_grows_with_the_reduction_length() -> None:
    # flce grad_input at V = 128256: a sequential float32 dot product's expected rel_l2
    assert accumulation_rel(128256) == pytest.approx(2**-24 * math.sqrt(128256 / 6))
    assert 8e-6 < accumulation_rel(128256) < 9e-6
    f = effective_floor((1e-7, 3e-8), 128256, 1.0)
    assert f.rel_l2 == pytest.approx(math.hypot(3e-8, accumulation_rel(128256)))
    # irrelevant for 16-bit outputs: their rounding floor dominates
    g = effective_floor((1e-3, 2.2e-3), 128256, 1.0)
    assert g.rel_l2 == pytest.approx(2.2e-3, rel=0.01)


def test_float32_sums_in_two_orders_sit_within_the_floor() -> None:
    # Two correct float32 GEMMs (one K-long pass against 64-long partial sums added up, as
    # split-K does) differ by the accumulation floor's order, not by a factor tied to either.
    g = torch.Generator().manual_seed(0)
    k = 16384
    a = torch.randn(64, k, generator=g)
    b = torch.randn(k, 32, generator=g)
    ref = a.double() @ b.double()
    seq = torch.zeros(64, 32)
    for s in range(0, k, 8):  # a sequential accumulator, 8 terms per step
        seq += a[:, s : s + 8] @ b[s : s + 8]
    split = sum(a[:, s : s + 64] @ b[s : s + 64] for s in range(0, k, 64))
    e_seq = float((seq.double() - ref).norm() / ref.norm())
    e_split = float((torch.as_tensor(split).double() - ref).norm() / ref.norm())
    assert e_seq <= 3 * accumulation_rel(k)
    assert e_split <= 3 * accumulation_rel(k)


def test_run_to_run_compares_in_slices_and_finds_the_worst_in_any(monkeypatch):
    """Large outputs are compared slice by slice (bounded float64 copies); the worst difference
    and the count hold across slices, and a NaN against a number in a late slice is infinite."""
    from kassay.validate import verdicts

    monkeypatch.setattr(verdicts, "_SLICE", 7)
    a = torch.zeros(5, 6)
    b = a.clone()
    b[0, 1], b[4, 5] = 1e-3, -2e-3
    r = verdicts.run_to_run(a, b)
    assert (r.identical, r.max_abs, r.n_diff) == (False, pytest.approx(2e-3), 2)
    b[4, 4] = float("nan")
    assert verdicts.run_to_run(a, b).max_abs == float("inf")
