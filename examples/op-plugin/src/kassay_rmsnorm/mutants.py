"""rmsnorm's mutants: wrong impls `kassay selftest` must catch (kassay_rmsnorm.probes)."""

from __future__ import annotations

import torch

from kassay.impls import Impl, register
from kassay_rmsnorm import OP, RmsNormParams
from kassay_rmsnorm.impls import Tensors, rmsnorm_eager, with_grads

_right = with_grads(rmsnorm_eager)


def _grad_weight_unnormalised(inputs: Tensors, params: RmsNormParams) -> Tensors:
    out = _right(inputs, params)
    x, gy = inputs["x"].float(), inputs["grad_y"].float()
    out["grad_weight"] = (gy * x).sum(dim=0).to(inputs["weight"].dtype)  # forgot rstd
    return out


def _mean_square_in_dtype(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # the statistics in x's dtype: float16 squares overflow past |x| ~ 256
    rstd = torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + eps)
    return weight * (x * rstd)


register(
    Impl(
        OP.name,
        "m_grad_weight_unnormalised",
        _grad_weight_unnormalised,
        kind="mutant",
        bug="grad_weight sums grad_y * x, forgetting the row's rsqrt",
    )
)
register(
    Impl(
        OP.name,
        "m_mean_square_in_dtype",
        with_grads(_mean_square_in_dtype),
        kind="mutant",
        bug="the mean square accumulated in the input dtype (float16 overflows on large rows)",
        exposes=("large",),
    )
)
