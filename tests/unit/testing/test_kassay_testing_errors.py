"""kassay.testing's errors are plain (#39): an unknown op or impl lists the known ones with a
did-you-mean, a function that does not fit the op's calling convention says which argument is
missing, a grid point the op refuses is skipped with the reason, never an error."""

from __future__ import annotations

import pytest

import kassay.testing as kt
from kassay.errors import UnknownImplError, UnknownOpError

SMALL = {"T": 16, "Hh": 2, "D": 8, "K": 2, "dtype": "float32"}


def test_an_unknown_op_or_impl_lists_the_known_ones() -> None:
    with pytest.raises(UnknownOpError, match=r"did you mean 'lse_merge'.*known ops: .*flce"):
        kt.assert_kernel("lse_merg", "torch", **SMALL)
    with pytest.raises(UnknownImplError, match=r"did you mean 'torch'.*known impls: .*torch"):
        kt.assert_kernel("lse_merge", "torchh", **SMALL)


def test_a_function_that_does_not_fit_says_which_argument_is_missing() -> None:
    def loss(x, weight, target, bias):  # type: ignore[no-untyped-def]  # no params
        return x.sum()

    with pytest.raises(TypeError, match=r"missing argument 'params' \(the 5th positional one\)"):
        kt.assert_kernel("flce", loss, N=8, H=8, V=16, dtype="float32")

    def merge(outs, lses, *, layout, accumulate):  # type: ignore[no-untyped-def]
        return outs[0], lses[0]

    with pytest.raises(TypeError, match=r"as a K-way merge .*: takes no keyword 'lse_layout'"):
        kt.assert_kernel("lse_merge", merge, **SMALL)


def test_a_point_the_op_refuses_is_skipped_with_the_reason() -> None:
    # flce refuses autocast with 16-bit params (the AMP case needs float32 x and W)
    refused = [
        c
        for c in kt.cases("flce", N=8, H=8, V=16, dtype=["float32", "bfloat16"], autocast="float16")
        if c.skip
    ]
    assert refused, "no refused point in the grid"
    with pytest.raises(pytest.skip.Exception, match=refused[0].skip[:40].replace("(", r"\(")):
        kt.assert_kernel("flce", "torch", refused[0])


def test_a_correct_function_passes_and_returns_the_results() -> None:
    import torch

    def merge(outs, lses, *, lse_layout, accumulate):  # type: ignore[no-untyped-def]
        lse = lses.float().transpose(1, 2)  # hT -> [K, T, Hh]
        lse = torch.where(torch.isposinf(lse), torch.full_like(lse, -torch.inf), lse)
        total = torch.logsumexp(lse, dim=0)
        w = torch.exp(lse - torch.where(torch.isfinite(total), total, 0)).nan_to_num(0.0)
        return (w[..., None] * outs.float()).sum(0).to(outs.dtype), total.T.contiguous()

    results = kt.assert_kernel("lse_merge", merge, **SMALL)
    assert results and {r.status for r in results} == {"passed"}
    assert {r.regime for r in results} >= {"normal", "empty_rows", "fa2_inf"}
