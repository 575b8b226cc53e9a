"""The calling convention every flce impl shares: leaves, autocast, backward, outputs.

An flce impl is written as a loss function
    loss_fn(x, weight, target, bias, params) -> loss | (loss, z_loss)
x [N, H], weight [V, H], bias [V] or None (leaf tensors with requires_grad), target [N] int64.
`as_run` turns it into the registry's `run(inputs, params)`: it makes fresh leaves, enters
torch.autocast when params.autocast is set (so the impl sees exactly what a training step under
AMP gives it), back-propagates the op's grad_output and collects the gradients. Every impl goes
through the same steps, so timings compare like with like.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from kassay.ops.flce import FlceParams
from kassay.ops.runtime.base import DTYPES

Tensors = dict[str, torch.Tensor]
LossFn = Callable[..., Any]


def autocast_ctx(params: FlceParams, device: torch.device) -> contextlib.AbstractContextManager:
    if params.autocast == "none":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[params.autocast])


def as_run(loss_fn: LossFn) -> Callable[[Tensors, Any], Tensors]:
    def run(inputs: Tensors, params: FlceParams) -> Tensors:
        x = inputs["x"].detach().requires_grad_(True)
        w = inputs["weight"].detach().requires_grad_(True)
        b = inputs["bias"].detach().requires_grad_(True) if "bias" in inputs else None
        with autocast_ctx(params, x.device):
            res = loss_fn(x, w, inputs["target"], b, params)
        loss, z_loss = res if isinstance(res, tuple) else (res, None)
        loss.backward(inputs["grad_output"].to(loss.dtype).expand_as(loss))
        out: Tensors = {"loss": loss.detach()}
        if params.return_z_loss:
            if z_loss is None:
                raise RuntimeError("impl returned no z_loss although return_z_loss was asked")
            out["z_loss"] = z_loss.detach()
        out["grad_input"] = _grad(x, "x")
        out["grad_weight"] = _grad(w, "weight")
        if b is not None:
            out["grad_bias"] = _grad(b, "bias")
        return out

    return run


def _grad(t: torch.Tensor, name: str) -> torch.Tensor:
    if t.grad is None:
        raise RuntimeError(f"no gradient reached {name}")
    return t.grad


def z_loss_term(lse: torch.Tensor, valid: torch.Tensor, params: FlceParams) -> torch.Tensor:
    """scale * lse^2 per non-ignored row, reduced like the loss (mean is sum / number of
    non-ignored rows, 0 when every row is ignored)."""
    zl = params.z_loss_scale * lse.float() ** 2 * valid
    if params.reduction == "none":
        return zl
    if params.reduction == "sum":
        return zl.sum()
    return zl.sum() / valid.sum().clamp_min(1)
