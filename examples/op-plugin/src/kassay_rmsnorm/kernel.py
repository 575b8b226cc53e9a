"""RMSNorm forward and backward in Triton: one program per row, statistics in float32.

rmsnorm(x [N, H], weight [H], grad_y [N, H], eps) -> y, grad_x [N, H], grad_weight [H], each in
x's dtype. grad_weight sums per-row float32 partials over the rows (a [N, H] float32 buffer,
summed by torch): simple rather than fast, which is all an example needs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: rows longer than this would not fit one program's registers at this block shape
MAX_H = 8192


@triton.jit
def _forward(X, W, Y, RSTD, H, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(X + row * H + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)
    tl.store(RSTD + row, rstd)
    tl.store(Y + row * H + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _backward(X, W, GY, RSTD, GX, GW_ROWS, H, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(X + row * H + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    gy = tl.load(GY + row * H + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.load(RSTD + row)
    xhat = x * rstd
    gxhat = gy * w
    c = tl.sum(gxhat * xhat, axis=0) / H
    gx = rstd * (gxhat - xhat * c)
    tl.store(GX + row * H + cols, gx.to(GX.dtype.element_ty), mask=mask)
    tl.store(GW_ROWS + row * H + cols, gy * xhat, mask=mask)


def rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, grad_y: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, grad_x, grad_weight) of RMSNorm for contiguous x, grad_y [N, H] and weight [H]."""
    n, h = x.shape
    if h > MAX_H:
        raise ValueError(f"H={h} is over this kernel's {MAX_H}")
    x, weight, grad_y = x.contiguous(), weight.contiguous(), grad_y.contiguous()
    block = triton.next_power_of_2(h)
    y = torch.empty_like(x)
    rstd = torch.empty(n, dtype=torch.float32, device=x.device)
    _forward[(n,)](x, weight, y, rstd, h, eps, BLOCK=block)
    grad_x = torch.empty_like(x)
    gw_rows = torch.empty(n, h, dtype=torch.float32, device=x.device)
    _backward[(n,)](x, weight, grad_y, rstd, grad_x, gw_rows, h, BLOCK=block)
    return y, grad_x, gw_rows.sum(dim=0).to(weight.dtype)
