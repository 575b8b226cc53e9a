"""rmsnorm's runtime: seeded inputs and the float64 reference (torch; workers only)."""

from __future__ import annotations

import torch

from kassay.ops.runtime import DTYPES, Tensors, generator
from kassay_rmsnorm import RmsNormParams


def make_inputs(params: RmsNormParams, regime: str, seed: int, device: torch.device) -> Tensors:
    """x [N, H], weight [H] (around 1) and grad_y [N, H], all in params.dtype; in the `large`
    regime x is ~300x larger (its squares overflow float16: 300^2 * H > 65504)."""
    p = params
    dt = DTYPES[p.dtype]
    x = torch.randn(p.N, p.H, generator=generator(seed, device, 1), device=device)
    if regime == "large":
        x = x * 300.0
    w = 1.0 + 0.1 * torch.randn(p.H, generator=generator(seed, device, 2), device=device)
    gy = torch.randn(p.N, p.H, generator=generator(seed, device, 3), device=device)
    return {"x": x.to(dt), "weight": w.to(dt), "grad_y": gy.to(dt)}


def reference(inputs: Tensors, params: RmsNormParams) -> Tensors:
    """y, grad_x [N, H] and grad_weight [H] in float64, from the inputs as given."""
    x, w, gy = (inputs[k].double() for k in ("x", "weight", "grad_y"))
    rstd = torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + params.eps)
    xhat = x * rstd
    gxhat = gy * w
    grad_x = rstd * (gxhat - xhat * (gxhat * xhat).mean(dim=-1, keepdim=True))
    return {"y": xhat * w, "grad_x": grad_x, "grad_weight": (gy * xhat).sum(dim=0)}
