"""rmsnorm's impls: the baseline (`torch`, eager PyTorch as Llama's RMSNorm computes it) and
`triton` (kassay_rmsnorm.kernel). Registered when kassay loads this op's impl modules."""

from __future__ import annotations

from typing import Any

import torch

from kassay.impls import Impl, register
from kassay_rmsnorm import OP, RmsNormParams

Tensors = dict[str, torch.Tensor]


def rmsnorm_eager(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm: statistics in float32, normalised x cast back before the weight."""
    h = x.float()
    h = h * torch.rsqrt(h.square().mean(dim=-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def with_grads(forward: Any) -> Any:
    """An impl's run from a differentiable forward(x, weight, eps): y and the gradients of
    (y * grad_y).sum() by autograd."""

    def run(inputs: Tensors, params: RmsNormParams) -> Tensors:
        x = inputs["x"].detach().requires_grad_(True)
        w = inputs["weight"].detach().requires_grad_(True)
        y = forward(x, w, params.eps)
        y.backward(inputs["grad_y"])
        assert x.grad is not None and w.grad is not None
        return {"y": y.detach(), "grad_x": x.grad, "grad_weight": w.grad}

    return run


def _triton(inputs: Tensors, params: RmsNormParams) -> Tensors:
    from kassay_rmsnorm.kernel import rmsnorm

    y, gx, gw = rmsnorm(inputs["x"], inputs["weight"], inputs["grad_y"], params.eps)
    return {"y": y, "grad_x": gx, "grad_weight": gw}


def _triton_supports(p: RmsNormParams, device: torch.device) -> str | None:
    from kassay_rmsnorm.kernel import MAX_H

    return f"rows longer than {MAX_H}" if p.H > MAX_H else None


register(
    Impl(
        OP.name,
        "torch",
        with_grads(rmsnorm_eager),
        "eager PyTorch, float32 statistics (Llama's RMSNorm): the baseline",
        kind="plugin",
    )
)
register(
    Impl(
        OP.name,
        "triton",
        _triton,
        "Triton, one program per row, float32 statistics and grad_weight partials",
        _triton_supports,
        kind="plugin",
    )
)
