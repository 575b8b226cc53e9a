"""Metrics against hand-computed values."""

import math

import pytest
import torch

from kassay.validate.metrics import compare, ordered_int, rounding_error


def test_abs_rel_l2_by_hand() -> None:
    ref = torch.tensor([1.0, -2.0, 4.0, 0.0], dtype=torch.float64)
    out = torch.tensor([1.5, -2.0, 3.0, 0.0], dtype=torch.float32)
    m = compare(out, ref, atol=0.0, rtol=0.0)
    assert m.max_abs == pytest.approx(1.0)
    assert m.rel_l2 == pytest.approx(math.sqrt(0.25 + 1.0) / math.sqrt(1 + 4 + 16))
    assert m.max_rel == pytest.approx(0.5)  # 0.5 / 1.0 beats 1.0 / 4.0
    assert m.n_bad == 2
    assert m.worst[0].__class__ is tuple or m.worst[0][0] == [2]
    assert m.worst[0][0] == [2] and m.worst[0][3] == pytest.approx(1.0)
    assert m.nan == m.inf == 0 and not m.all_zero


def test_worst_indices_are_multidimensional() -> None:
    ref = torch.zeros(3, 4, dtype=torch.float64)
    out = torch.zeros(3, 4)
    out[2, 1] = 5.0
    m = compare(out, ref, atol=0, rtol=0)
    assert m.worst[0][0] == [2, 1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_ulp_counts_representable_steps(dtype: torch.dtype) -> None:
    one = torch.tensor([1.0], dtype=dtype)
    nxt = (
        torch.nextafter(one.float(), torch.tensor([2.0])).to(dtype)
        if dtype == torch.float32
        else (one.view(torch.int16) + 3).view(dtype)
    )
    m = compare(nxt, torch.tensor([1.0], dtype=torch.float64), atol=0, rtol=0)
    assert m.max_ulp == (1 if dtype == torch.float32 else 3)


def test_ulp_across_zero_and_sign() -> None:
    a = torch.tensor([-0.0, 0.0, -1.0, 1.0])
    o = ordered_int(a)
    assert o[0] == o[1] == 0
    assert o[2] == -o[3]


def test_nan_inf_against_reference() -> None:
    ref = torch.tensor([1.0, float("inf"), float("-inf"), 2.0], dtype=torch.float64)
    out = torch.tensor([float("nan"), float("inf"), float("inf"), 2.0])
    m = compare(out, ref, atol=1e-5, rtol=1e-5)
    assert m.nan == 1 and m.inf == 2 and m.ref_inf == 2 and m.ref_nan == 0
    # out NaN where ref finite, and +inf where ref is -inf: two mismatches; +inf==+inf is exact
    assert m.mismatched_nonfinite == 2
    assert m.max_abs == 0.0  # the finite pair (2, 2) matches


def test_all_zero_flags() -> None:
    m = compare(torch.zeros(4), torch.ones(4, dtype=torch.float64), atol=0, rtol=0)
    assert m.all_zero and not m.ref_all_zero
    m2 = compare(torch.zeros(4), torch.zeros(4, dtype=torch.float64), atol=0, rtol=0)
    assert m2.all_zero and m2.ref_all_zero and m2.rel_l2 == 0.0


def test_shape_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="shape"):
        compare(torch.zeros(3), torch.zeros(4, dtype=torch.float64), atol=0, rtol=0)


def test_rounding_floor_is_dtype_rounding_at_least_one_ulp() -> None:
    ref = torch.tensor([1.0 + 2**-12, 3.0], dtype=torch.float64)
    max_abs, rel = rounding_error(ref, torch.bfloat16)
    assert max_abs == pytest.approx(2**-7 * 2)  # one bf16 ULP at 3.0 beats the 2^-12 rounding
    assert rel == pytest.approx(2**-7 / math.sqrt(2))  # eps / sqrt(n) beats the realized
    big = torch.linspace(1, 2, 10_000, dtype=torch.float64) + 1e-5
    m_abs, m_rel = rounding_error(big, torch.bfloat16)
    assert 2**-8 <= m_abs <= 2**-6
    assert 2**-10 < m_rel < 2**-8  # realized rounding of many elements dominates
    assert rounding_error(ref[1:], torch.float32) == (
        pytest.approx(2**-23 * 2),
        pytest.approx(2**-23),
    )
