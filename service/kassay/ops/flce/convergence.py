"""flce's place in the convergence model (kassay.validate.convergence): the LM head and its loss.

An flce impl returns the loss and its gradients in one call (a fused kernel computes them in
the forward, as Liger's and kassay's do); trained through an autograd Function whose backward
hands back those gradients scaled by the upstream one. A gradient bug therefore trains the
model wrong even where the loss it reports is right.
"""

from __future__ import annotations

from typing import Any

import torch

from kassay.ops.flce import FlceParams
from kassay.ops.registry import Impl

SLOT = "head"
#: the correct alternative trained as the control arm (the benign band between correct kernels)
CONTROL = "alt_chunked"


def wrap(impl: Impl, params: FlceParams, calls: list[int]) -> Any:
    """(hidden [N, H] float32, weight [V, H] float32, target [N]) -> mean loss, differentiable
    in hidden and weight through the impl's own gradients; calls[0] counts the impl's calls."""
    dt = params.torch_dtype

    class _Head(torch.autograd.Function):
        @staticmethod
        def forward(  # type: ignore[override]
            ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor
        ) -> torch.Tensor:
            calls[0] += 1
            inputs = {
                "x": hidden.detach().to(dt).contiguous(),
                "weight": weight.detach().to(dt).contiguous(),
                "target": target,
                "grad_output": torch.ones((), dtype=torch.float32, device=hidden.device),
            }
            with torch.enable_grad():  # the impl may run autograd inside (an eager baseline)
                out = impl.run(inputs, params)
            ctx.save_for_backward(out["grad_input"].float(), out["grad_weight"].float())
            return out["loss"].float().reshape(())

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> Any:  # type: ignore[override]
            grad_input, grad_weight = ctx.saved_tensors
            return g * grad_input, g * grad_weight, None

    return _Head.apply
